module github.com/edgeprobe/edgeprobe

go 1.26.8

require (
	github.com/go-delve/delve v1.27.2
	github.com/google/pprof v0.0.0-20260906184651-6331bc6350fe
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.10
	golang.org/x/arch v0.32.0
	golang.org/x/sys v0.49.0
	google.golang.org/protobuf v1.36.11
)

require github.com/inconshreveable/mousetrap v1.1.0 // indirect
