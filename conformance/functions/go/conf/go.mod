module staccato.local/conformance/go

go 1.22

require staccato.local/go v0.0.0

// For editors and `go vet` in this directory only: a deploy builds with
// runtimes/go/build-function.sh, whose own go.mod points at the runtime.
replace staccato.local/go => ../../../../runtimes/go
