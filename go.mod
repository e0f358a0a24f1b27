module github.com/plover-run/plover

go 1.26.8

require (
	github.com/google/uuid v1.6.0
	github.com/klauspost/compress v1.20.3
)
