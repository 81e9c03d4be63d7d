# gdbcapture.py: under gdb, record the registers a capture would copy at the
# first instruction of each function named in $EP_FUNCS (comma-separated ELF
# symbols) and at its return, as JSON lines in $EP_OUT. The dwarfargs tests
# decode them and compare with what the program printed. gdb, not our
# runtime, reads the registers here: it is the reference the runtime's own
# capture is later held to.
#   gdb -batch -nx -x gdbcapture.py ./program
import json
import os

import gdb

MASK = (1 << 64) - 1
STRMAX = 64
STACKMAX = 64
out = open(os.environ["EP_OUT"], "w")


def reg(name):
    return int(gdb.selected_frame().read_register(name)) & MASK


def xmm(i):
    return int(gdb.parse_and_eval("$xmm%d.v2_int64[0]" % i)) & MASK


def mem(addr, n):
    try:
        return bytes(gdb.selected_inferior().read_memory(addr, n))
    except gdb.MemoryError:
        return None


def cstr(addr):
    if addr == 0:
        return None
    b = mem(addr, STRMAX)
    if b is None:  # maybe near the end of a mapping: byte by byte
        b = bytearray()
        for i in range(STRMAX):
            c = mem(addr + i, 1)
            if c is None:
                if not b:
                    return {"fault": True}
                break
            b += c
        b = bytes(b)
    n = b.find(b"\0")
    if n >= 0:
        return {"bytes": b[:n].hex(), "complete": True}
    return {"bytes": b.hex(), "complete": False}


class Exit(gdb.FinishBreakpoint):
    def __init__(self, frame, name):
        super().__init__(frame, internal=True)
        self.name = name
        self.silent = True

    def stop(self):
        rax = reg("rax")
        out.write(json.dumps({"fn": self.name, "kind": "exit", "int": [rax, reg("rdx")],
                              "sse": [xmm(0), xmm(1)], "str": [cstr(rax)]}) + "\n")
        return False

    def out_of_scope(self):
        out.write(json.dumps({"fn": self.name, "kind": "unwound"}) + "\n")


class Entry(gdb.Breakpoint):
    def __init__(self, name):
        spec = ("*" + name) if name.isidentifier() else ("*'%s'" % name)
        super().__init__(spec, internal=True)
        self.name = name
        self.silent = True

    def stop(self):
        ints = [reg(r) for r in ("rdi", "rsi", "rdx", "rcx", "r8", "r9")]
        stack = mem(reg("rsp") + 8, STACKMAX) or b""
        out.write(json.dumps({"fn": self.name, "kind": "entry", "int": ints, "sse": [xmm(i) for i in range(8)],
                              "stack": stack.hex(), "str": [cstr(v) for v in ints]}) + "\n")
        Exit(gdb.newest_frame(), self.name)
        return False


gdb.execute("set pagination off")
gdb.execute("set confirm off")
for n in os.environ["EP_FUNCS"].split(","):
    Entry(n)
gdb.execute("run")
out.close()
