package objectstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/minio"
)

// noS3Env keeps the developer's own AWS settings out of a test.
func noS3Env(t *testing.T) {
	for _, k := range []string{"PLOVER_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
		t.Setenv(k, "")
	}
}

func wantErr(t *testing.T, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", subs)
	}
	t.Logf("error: %v", err)
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

func TestOpenFS(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, url := range []string{dir, "file://" + dir} {
		s, err := Open(ctx, url, S3Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.(*FS); !ok || s.String() != "file://"+dir {
			t.Fatalf("Open(%q) = %T %s", url, s, s)
		}
	}
	// Relative paths stay relative to the working directory, as the CLI's
	// file://DATA/store default with a relative --data needs.
	t.Chdir(dir)
	s, err := Open(ctx, "file://rel/store", S3Options{})
	if err != nil || s.String() != "file://"+filepath.Join(dir, "rel/store") {
		t.Fatalf("relative file URL: %v, %v", s, err)
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	noS3Env(t)
	// None of these may reach the network: the endpoint is a closed port,
	// which would give a different error.
	opts := S3Options{Endpoint: "http://127.0.0.1:1", AccessKey: "a", SecretKey: "b"}
	for _, tc := range []struct{ url, want string }{
		{"gs://bucket", "unsupported scheme"},
		{"http://example.com/x", "unsupported scheme"},
		{"s3://", "empty bucket name"},
		{"s3:///prefix", "empty bucket name"},
		{"s3://Upper", `invalid bucket name "Upper"`},
		{"s3://under_score", `invalid bucket name "under_score"`},
		{"s3://ab", `invalid bucket name "ab"`},
		{"s3://bucket:9000/x", `invalid bucket name "bucket:9000"`},
		{"s3://192.168.1.1", "invalid bucket name"},
		{"s3://bucket?versionId=1", "no query"},
		{"s3://bucket/../x", "prefix"},
		{"s3://bucket/a//b", "prefix"},
	} {
		_, err := Open(context.Background(), tc.url, opts)
		wantErr(t, err, tc.want)
	}
}

func TestNewS3Config(t *testing.T) {
	noS3Env(t)
	ctx := context.Background()
	_, err := Open(ctx, "s3://bucket", S3Options{Endpoint: "http://127.0.0.1:1"})
	wantErr(t, err, "s3://bucket: no credentials", "AWS_ACCESS_KEY_ID")
	for _, ep := range []string{"ftp://host", "http://host/path", "http://user@host", "host/path"} {
		_, err := Open(ctx, "s3://bucket", S3Options{Endpoint: ep, AccessKey: "a", SecretKey: "b"})
		wantErr(t, err, "S3 endpoint")
	}
}

func TestS3OptionsFromEnv(t *testing.T) {
	noS3Env(t)
	if o := (S3Options{}).resolved(); o.Endpoint != DefaultS3Endpoint || o.AccessKey != "" {
		t.Fatalf("defaults = %+v", o)
	}
	t.Setenv("PLOVER_S3_ENDPOINT", "http://minio:9000")
	t.Setenv("AWS_ENDPOINT_URL", "http://ignored:1")
	t.Setenv("AWS_DEFAULT_REGION", "eu-west-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AK")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "SK")
	o := (S3Options{}).resolved()
	if o != (S3Options{Endpoint: "http://minio:9000", Region: "eu-west-1", AccessKey: "AK", SecretKey: "SK"}) {
		t.Fatalf("from env = %+v", o)
	}
	// Explicit options win, and a key pair is never half from the env.
	o = (S3Options{Endpoint: "e", Region: "r", AccessKey: "A"}).resolved()
	if o != (S3Options{Endpoint: "e", Region: "r", AccessKey: "A"}) {
		t.Fatalf("explicit = %+v", o)
	}
	for _, tc := range []struct {
		ep       string
		insecure bool
		host     string
		secure   bool
	}{
		{"s3.amazonaws.com", false, "s3.amazonaws.com", true},
		{"127.0.0.1:9000", true, "127.0.0.1:9000", false},
		{"http://127.0.0.1:9000", false, "127.0.0.1:9000", false},
		{"https://minio.example:443/", false, "minio.example:443", true},
		{"https://minio.example", true, "minio.example", false},
	} {
		host, secure, err := parseEndpoint(tc.ep, tc.insecure)
		if err != nil || host != tc.host || secure != tc.secure {
			t.Errorf("parseEndpoint(%q, %v) = %q, %v, %v", tc.ep, tc.insecure, host, secure, err)
		}
	}
}

func TestOpenS3Errors(t *testing.T) {
	noS3Env(t)
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "exists")
	ctx := context.Background()
	good := s3Options(srv)

	t.Run("ok", func(t *testing.T) {
		s, err := Open(ctx, "s3://exists/some/prefix/", good)
		if err != nil {
			t.Fatal(err)
		}
		if s.String() != "s3://exists/some/prefix" {
			t.Fatalf("String() = %s", s)
		}
	})

	t.Run("from env", func(t *testing.T) {
		t.Setenv("PLOVER_S3_ENDPOINT", srv.Endpoint)
		t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
		if _, err := Open(ctx, "s3://exists", S3Options{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("missing bucket", func(t *testing.T) {
		_, err := Open(ctx, "s3://nosuchbucket", good)
		wantErr(t, err, `s3://nosuchbucket: bucket "nosuchbucket" does not exist at `+srv.Endpoint)
	})

	t.Run("bad secret", func(t *testing.T) {
		o := good
		o.SecretKey += "x"
		_, err := Open(ctx, "s3://exists", o)
		wantErr(t, err, "s3://exists: access denied at "+srv.Endpoint, "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
	})

	t.Run("unknown access key", func(t *testing.T) {
		o := good
		o.AccessKey = "nobody"
		// Bad credentials must not be mistaken for a missing bucket.
		_, err := Open(ctx, "s3://nosuchbucket", o)
		wantErr(t, err, "access denied", "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
	})

	t.Run("TLS to plain HTTP", func(t *testing.T) {
		o := good
		o.Endpoint = "https://" + srv.Addr
		_, err := Open(ctx, "s3://exists", o)
		wantErr(t, err, "TLS to https://"+srv.Addr, "http:// endpoint")
	})

	t.Run("unreachable", func(t *testing.T) {
		o := good
		o.Endpoint = "http://" + closedPort(t)
		start := time.Now()
		_, err := Open(ctx, "s3://exists", o)
		wantErr(t, err, "s3://exists: endpoint unreachable ("+o.Endpoint+")", "dial tcp", "connection refused")
		if d := time.Since(start); d > S3OpenTimeout {
			t.Errorf("took %v", d)
		}
	})

	t.Run("no answer", func(t *testing.T) {
		// Accepts connections and never answers: only the timeout ends it.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		o := good
		o.Endpoint = "http://" + l.Addr().String()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start := time.Now()
		_, err = Open(cctx, "s3://exists", o)
		wantErr(t, err, "endpoint unreachable", "no answer")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v does not wrap DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v despite a 1s deadline", d)
		}
	})
}

func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Objects outside a store's prefix, including under a longer prefix that
// shares its first characters, are invisible to it.
func TestS3PrefixIsolation(t *testing.T) {
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "iso")
	ctx := context.Background()
	open := func(url string) Store {
		s, err := Open(ctx, url, s3Options(srv))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, ab, root := open("s3://iso/tenant/a"), open("s3://iso/tenant/ab"), open("s3://iso")
	put(t, a, "x/y", []byte("a"))
	put(t, ab, "z", []byte("ab"))
	if l, _ := a.List(ctx, ""); strings.Join(keys(l), ",") != "x/y" {
		t.Errorf("a lists %v", keys(l))
	}
	if l, _ := root.List(ctx, ""); strings.Join(keys(l), ",") != "tenant/a/x/y,tenant/ab/z" {
		t.Errorf("root lists %v", keys(l))
	}
	if got := get(t, root, "tenant/a/x/y"); string(got) != "a" {
		t.Errorf("root reads %q", got)
	}
	if _, err := a.Stat(ctx, "z"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a sees ab's object: %v", err)
	}
}

// A failed Put leaves neither the object nor its temporary file behind.
func TestFSFailedPutLeavesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		r    func() (*bytes.Reader, int64)
	}{
		{"short", func() (*bytes.Reader, int64) { return bytes.NewReader([]byte("abc")), 10 }},
		{"long", func() (*bytes.Reader, int64) { return bytes.NewReader([]byte("abcdef")), 3 }},
	} {
		r, size := tc.r()
		if err := s.Put(ctx, "d/"+tc.name, r, size); err == nil {
			t.Errorf("%s: put succeeded", tc.name)
		}
	}
	if err := s.Put(ctx, "d/failing", &failingReader{n: 100}, 1000); !errors.Is(err, errBoom) {
		t.Errorf("failing reader: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Put(cctx, "d/cancelled", bytes.NewReader([]byte("x")), 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "d"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind: d/%s", e.Name())
	}
	if l, err := s.List(ctx, ""); err != nil || len(l) != 0 {
		t.Errorf("list = %v, %v", keys(l), err)
	}
}

// A temporary file of a Put in progress (or of a crashed process) is not an
// object.
func TestFSListHidesTempFiles(t *testing.T) {
	dir := t.TempDir()
	s, err := NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, "d/real", []byte("x"))
	if err := os.WriteFile(filepath.Join(dir, "d", ".put-12345"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.List(context.Background(), ""); strings.Join(keys(l), ",") != "d/real" {
		t.Fatalf("list = %v", keys(l))
	}
}

// A missing object on S3 is reported with the store it was looked for in
// (bucket and prefix) and the object's full name: with many nodes and
// buckets, "get bundles/x: object not found" does not say where to look.
func TestS3NotFoundNamesTheStore(t *testing.T) {
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "nf-bucket")
	ctx := context.Background()
	s, err := Open(ctx, "s3://nf-bucket/tenant/a", s3Options(srv))
	if err != nil {
		t.Fatal(err)
	}
	_, gerr := s.Get(ctx, "bundles/missing.tar.zst")
	_, _, terr := s.GetTagged(ctx, "bundles/missing.tar.zst")
	_, serr := s.Stat(ctx, "bundles/missing.tar.zst")
	uerr := s.Touch(ctx, "bundles/missing.tar.zst")
	for op, err := range map[string]error{"get": gerr, "get tagged": terr, "stat": serr, "touch": uerr} {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", op, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "s3://nf-bucket/tenant/a") || !strings.Contains(msg, "tenant/a/bundles/missing.tar.zst") {
			t.Errorf("%s: %q names neither the bucket nor the object", op, msg)
		}
	}
}

// An endpoint refused with credentials in it (http://user:secret@host)
// names it without the password, nor a piece of it, however it fails:
// the message reaches the server's log and a command's output.
func TestParseEndpointHidesAPassword(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		says string
	}{
		{"http://user:s3cr3tpw@minio:9000", "http://user:xxxxx@minio:9000"},
		{"https://user:s3cr3tpw@minio:9000/path", "credentials do not go in the endpoint"},
		{"ftp://user:s3cr3tpw@minio:9000", "scheme must be http or https"},
		{"http://user:s3cr%zz3tpw@minio:9000", "http://xxxxx@minio:9000"},               // url.Parse fails: an invalid escape
		{"http://user:s3cr3tpw@minio:9000/%zz", "http://xxxxx@minio:9000\": not a URL"}, // fails after the host
		{"user:s3cr3tpw@minio:9000", `"xxxxx@minio:9000"`},                              // no scheme
		{"http://user:s3cr3tpw@[::1", "not a URL"},
		{"http://user:s3cr3t/pw@minio:9000", `"http://xxxxx@minio:9000"`}, // an AWS secret may hold a "/"
	} {
		_, _, err := parseEndpoint(tc.ep, false)
		if err == nil {
			t.Errorf("%s: no error", tc.ep)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "s3cr") || strings.Contains(msg, "3tpw") || !strings.Contains(msg, tc.says) {
			t.Errorf("%s: %q shows the password, or does not say %q", tc.ep, msg, tc.says)
		}
	}
}

// A mistyped store URL may carry credentials; its error names what is
// wrong with the URL shown without them (a user and password as
// "xxxxx@", no query or fragment). The errors quoted the whole URL.
func TestOpenHidesCredentialsInTheURL(t *testing.T) {
	noS3Env(t)
	opts := S3Options{Endpoint: "http://127.0.0.1:1", AccessKey: "a", SecretKey: "b"}
	for _, tc := range []struct{ url, says string }{
		{"s3://AKIAEXAMPLE:wJalrSECRETKEY@my-bucket", `store "s3://xxxxx@my-bucket": an s3:// URL holds no user or password`},
		{"s3://AKIAEXAMPLE:wJalr/SECRETKEY@my-bucket/prefix", `store "s3://xxxxx@my-bucket/prefix": an s3:// URL holds no user or password`},
		{"s3://my-bucket?secret_key=wJalrSECRETKEY", `store "s3://my-bucket": s3:// URLs take no query or fragment`},
		{"s3://my-bucket#wJalrSECRETKEY", `store "s3://my-bucket": s3:// URLs take no query or fragment`},
		{"s3://AKIAEXAMPLE:wJalr?SECRETKEY@my-bucket", `store "s3://xxxxx@": an s3:// URL holds no user or password`},
		{"https://AKIAEXAMPLE:wJalrSECRETKEY@s3.example.com/b", `store "https://xxxxx@s3.example.com/b": unsupported scheme`},
		{"https://s3.example.com/b?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=wJalrSECRETKEY", `store "https://s3.example.com/b": unsupported scheme`},
	} {
		_, err := Open(context.Background(), tc.url, opts)
		if err == nil {
			t.Errorf("%s: no error", tc.url)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "wJalr") || strings.Contains(msg, "SECRETKEY") || strings.Contains(msg, "AKIAEXAMPLE") || !strings.Contains(msg, tc.says) {
			t.Errorf("%s: %q shows a credential, or does not say %q", tc.url, msg, tc.says)
		}
	}
	// NewS3 is given the bucket itself, unchecked.
	_, err := NewS3(context.Background(), "AKIAEXAMPLE:wJalrSECRETKEY@my-bucket", "", opts)
	if msg := fmt.Sprint(err); strings.Contains(msg, "wJalr") || strings.Contains(msg, "AKIAEXAMPLE") || !strings.Contains(msg, `invalid bucket name "xxxxx@my-bucket"`) {
		t.Errorf("NewS3: %q shows a credential, or does not name the bucket as invalid", msg)
	}
}
