package minio

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	miniogo "github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

func TestStopRestartKeepsData(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	s.MustCreateBucket(t, "keep")
	s.MustCreateBucket(t, "keep") // idempotent
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutObject(ctx, "keep", "obj", strings.NewReader("payload"), 7, miniogo.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("port still accepts connections after Stop")
	}

	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Addr != addr {
		t.Fatalf("restarted on %s, was %s", s.Addr, addr)
	}
	obj, err := c.GetObject(ctx, "keep", "obj", miniogo.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	if b, err := io.ReadAll(obj); err != nil || string(b) != "payload" {
		t.Fatalf("after restart: %q, %v", b, err)
	}
	// Restart of a running server stops it first.
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestServersAreIndependent(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Addr == b.Addr || a.SecretKey == b.SecretKey || a.DataDir == b.DataDir {
		t.Fatalf("shared: %s/%s", a.Addr, b.Addr)
	}
	a.MustCreateBucket(t, "only-in-a")
	cb, err := b.Client()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cb.BucketExists(context.Background(), "only-in-a"); err != nil || ok {
		t.Fatalf("b sees a's bucket: %v, %v", ok, err)
	}
	// a's credentials mean nothing to b.
	cross, err := miniogo.New(b.Addr, &miniogo.Options{
		Creds:  credentials.NewStaticV4(a.AccessKey, a.SecretKey, ""),
		Region: "us-east-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cross.ListBuckets(context.Background()); err == nil {
		t.Fatal("b accepted a's credentials")
	}
}

func TestRingBuffer(t *testing.T) {
	r := newRingBuffer(8)
	io.WriteString(r, "0123456789")
	io.WriteString(r, "ab")
	if got := r.String(); got != "456789ab" {
		t.Fatalf("got %q", got)
	}
}

func TestInstallUsesOverride(t *testing.T) {
	t.Setenv("PLOVER_MINIO_BIN", "/nonexistent/minio")
	if _, err := Install(context.Background(), io.Discard); err == nil || !strings.Contains(err.Error(), "PLOVER_MINIO_BIN") {
		t.Fatalf("err = %v", err)
	}
}
