module staccato.local/go

go 1.22
