module staccato.local/socialnet

go 1.23.0

require (
	github.com/bradfitz/gomemcache v0.0.0-20260422231931-4d751bb6e37c
	github.com/jackc/pgx/v5 v5.7.6
	github.com/redis/go-redis/v9 v9.17.3
	staccato.local/go v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.2 // indirect
	golang.org/x/crypto v0.37.0 // indirect
	golang.org/x/sync v0.13.0 // indirect
	golang.org/x/text v0.24.0 // indirect
)

// For building cmd/rpcserver (the RPC-server variant) from this repository.
// A function build ignores it: the engine's build names the runtime itself.
replace staccato.local/go => ../../../runtimes/go
