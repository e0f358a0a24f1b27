// Command install-minio builds the pinned MinIO release into the cache that
// the S3 tests use, and prints the binary's path, so that CI pays for the
// build once, up front, rather than inside a test's timeout.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/plover-run/plover/internal/minio"
)

func main() {
	start := time.Now()
	bin, err := minio.Install(context.Background(), os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "install-minio: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "install-minio: MinIO %s ready in %v\n", minio.Release, time.Since(start).Round(time.Second))
	fmt.Println(bin)
}
