	.intel_syntax noprefix
	.text
	.globl start
# rdi = the data block (see internal/inject/loader.go for the layout)
start:
	push rbx
	push r12
	push r13
	push r14
	push r15
	mov rbx, rdi
	call qword ptr [rbx+0x20]      # pthread_self
	mov rdi, rax
	call qword ptr [rbx+0x18]      # pthread_detach: nobody joins us
	cmp qword ptr [rbx+0x40], 0    # handle already known: route only
	jne route_start
	lea rdi, [rbx+0x100]           # path
	mov esi, dword ptr [rbx+0x80]  # flags
	call qword ptr [rbx+0x00]      # dlopen
	mov [rbx+0x40], rax
	test rax, rax
	jnz loaded
	cmp qword ptr [rbx+0x08], 0
	je close_fd
	call qword ptr [rbx+0x08]      # dlerror
	mov [rbx+0x48], rax
	test rax, rax
	jz close_fd
	# Its message, copied (at most 255 bytes and a NUL): the string lives
	# in this thread's dlerror buffer, which glibc frees when the thread
	# exits, before hotpatch reads it.
	lea rdi, [rbx+0x200]
	xor ecx, ecx
copy_msg:
	mov dl, byte ptr [rax+rcx]
	mov byte ptr [rdi+rcx], dl
	test dl, dl
	jz close_fd
	inc ecx
	cmp ecx, 255
	jb copy_msg
	mov byte ptr [rdi+rcx], 0
	jmp close_fd
loaded:
	xor r12d, r12d
sym:
	mov rdi, [rbx+0x40]
	mov rsi, r12
	shl rsi, 5
	lea rsi, [rbx+rsi+0x140]
	call qword ptr [rbx+0x10]      # dlsym(handle, hook name)
	mov [rbx+r12*8+0x60], rax
	inc r12
	cmp r12, 4
	jb sym
route_start:
	xor r12d, r12d
route:
	cmp r12, [rbx+0x58]
	jae close_fd
	mov r13, r12
	shl r13, 5
	lea r13, [rbx+r13+0x400]       # entry {slot, hook index, page, prot or -1}
	mov rax, [r13+8]
	mov r14, [rbx+rax*8+0x60]
	test r14, r14
	jz next
	cmp qword ptr [r13+24], -1
	je store
	mov rdi, [r13+16]              # mprotect(page, 4096, PROT_READ|PROT_WRITE)
	mov esi, 4096
	mov edx, 3
	mov eax, 10
	syscall
	test rax, rax
	jnz next                       # cannot write the page: the slot stays, hotpatch sees it
store:
	mov rax, [r13]
	mov [rax], r14                 # one aligned 8-byte store
	cmp qword ptr [r13+24], -1
	je next
	mov rdi, [r13+16]              # mprotect back
	mov esi, 4096
	mov rdx, [r13+24]
	mov eax, 10
	syscall
next:
	inc r12
	jmp route
close_fd:
	mov rdi, [rbx+0x38]
	test rdi, rdi
	js finish
	mov eax, 3                     # close(memfd): the mapping keeps the file
	syscall
finish:
	mov dword ptr [rbx+0x50], 1    # done: hotpatch polls this word
	xor eax, eax
	pop r15
	pop r14
	pop r13
	pop r12
	pop rbx
	ret
