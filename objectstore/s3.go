package objectstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/plover-run/plover/errdefs"
)

// S3Options says how to reach an S3-compatible service. Empty fields take
// their values from the environment (see NewS3).
type S3Options struct {
	// Endpoint is host[:port] or an http:// or https:// URL; an http:// URL
	// implies Insecure.
	Endpoint  string
	Region    string
	AccessKey string
	SecretKey string
	// Insecure talks plain HTTP instead of TLS, as a local MinIO needs.
	Insecure bool
}

// DefaultS3Endpoint is used when neither S3Options nor the environment names
// an endpoint.
const DefaultS3Endpoint = "s3.amazonaws.com"

// S3OpenTimeout bounds the reachability check NewS3 makes, so that a wrong
// endpoint fails a command promptly instead of hanging in retries.
const S3OpenTimeout = 10 * time.Second

// unknownSizePartSize caps the buffer minio-go allocates for a Put of unknown
// size; left to itself it sizes parts for a 5 TiB object (~550 MiB each).
// 16 MiB parts still allow objects up to ~156 GiB.
const unknownSizePartSize = 16 << 20

// S3 stores objects in one bucket of an S3-compatible service, optionally
// under a key prefix.
type S3 struct {
	client   *minio.Client
	bucket   string
	prefix   string           // "" or segments without a trailing slash
	region   string           // as configured; "" lets minio-go ask the service
	endpoint string           // scheme://host for messages
	now      func() time.Time // nil: time.Now (a test's clock otherwise)

	mu      sync.Mutex
	bucket0 time.Time // when a request last found the bucket there; zero: not since it was found missing
}

// bucketTTL is how long a bucket found there (by any request that
// succeeded, or by the last bucket check) is taken to be there still: a
// HEAD's bare 404 within it is a missing object without asking the bucket.
const bucketTTL = 30 * time.Second

// sawBucket remembers that a request just found the bucket there.
func (s *S3) sawBucket() {
	s.mu.Lock()
	s.bucket0 = s.clock()
	s.mu.Unlock()
}

func (s *S3) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// resolved fills the empty fields of o from the environment.
func (o S3Options) resolved() S3Options {
	if o.Endpoint == "" {
		o.Endpoint = firstEnv("PLOVER_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
	}
	if o.Endpoint == "" {
		o.Endpoint = DefaultS3Endpoint
	}
	if o.Region == "" {
		o.Region = firstEnv("AWS_REGION", "AWS_DEFAULT_REGION")
	}
	if o.AccessKey == "" && o.SecretKey == "" {
		o.AccessKey = os.Getenv("AWS_ACCESS_KEY_ID")
		o.SecretKey = os.Getenv("AWS_SECRET_ACCESS_KEY")
	}
	return o
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// parseEndpoint splits an endpoint into the host[:port] minio-go wants and
// whether to use TLS. Its errors never show a password the endpoint holds
// (http://user:secret@host, refused: credentials go in AWS_ACCESS_KEY_ID
// and AWS_SECRET_ACCESS_KEY): they reach logs, and a command's output.
func parseEndpoint(ep string, insecure bool) (host string, secure bool, err error) {
	if !strings.Contains(ep, "://") {
		if ep == "" || strings.ContainsAny(ep, "/?#@ ") {
			shown := ep
			if strings.Contains(ep, "@") {
				shown = endpointHead(ep)
			}
			return "", false, fmt.Errorf("S3 endpoint %q: want host[:port] or http(s)://host[:port]", shown)
		}
		return ep, !insecure, nil
	}
	u, err := url.Parse(ep)
	if err != nil {
		// url.Parse's error quotes the whole string, and its reason may
		// quote a piece of a password (an invalid escape in it).
		return "", false, fmt.Errorf("S3 endpoint %q: not a URL: want http(s)://host[:port]", endpointHead(ep))
	}
	shown := u.Redacted()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", false, fmt.Errorf("S3 endpoint %q: scheme must be http or https", shown)
	case u.User != nil:
		return "", false, fmt.Errorf("S3 endpoint %q: credentials do not go in the endpoint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", shown)
	case u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return "", false, fmt.Errorf("S3 endpoint %q: want %s://host[:port] with nothing after it", shown, u.Scheme)
	}
	return u.Host, u.Scheme == "https" && !insecure, nil
}

// endpointHead is ep's scheme and host for a message, nothing after them,
// and any user and password before the host as "xxxxx@" (redactURL's
// rule, which masks a password holding a "/" whole).
func endpointHead(ep string) string {
	shown := redactURL(ep)
	scheme, rest, ok := strings.Cut(shown, "://")
	if !ok {
		scheme, rest = "", shown
	}
	rest, _, _ = strings.Cut(rest, "/")
	if !ok {
		return rest
	}
	return scheme + "://" + rest
}

// NewS3 opens bucket (keys under prefix, if any) and checks that the bucket
// exists and the credentials are accepted, so configuration mistakes surface
// here rather than at the first deploy.
//
// Empty option fields come from the environment: PLOVER_S3_ENDPOINT (then
// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; default s3.amazonaws.com over TLS),
// AWS_REGION (then AWS_DEFAULT_REGION; empty means ask the service),
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN).
func NewS3(ctx context.Context, bucket, prefix string, opts S3Options) (*S3, error) {
	name := redactURL(s3Name(bucket, prefix)) // the bucket and prefix are not checked yet
	if err := checkBucket(bucket); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		if err := CheckKey(prefix); err != nil {
			return nil, fmt.Errorf("%s: prefix: %w", name, err)
		}
	}
	fromEnv := opts.AccessKey == "" && opts.SecretKey == ""
	opts = opts.resolved()
	host, secure, err := parseEndpoint(opts.Endpoint, opts.Insecure)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if opts.AccessKey == "" || opts.SecretKey == "" {
		return nil, fmt.Errorf("%s: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", name)
	}
	token := ""
	if fromEnv {
		token = os.Getenv("AWS_SESSION_TOKEN")
	}
	mopts := &minio.Options{
		Creds:  credentials.NewStaticV4(opts.AccessKey, opts.SecretKey, token),
		Secure: secure,
		Region: opts.Region,
	}
	if !s3utils.IsAmazonEndpoint(url.URL{Host: host}) {
		// Virtual-host lookup needs wildcard DNS that a self-hosted MinIO
		// rarely has.
		mopts.BucketLookup = minio.BucketLookupPath
	}
	client, err := minio.New(host, mopts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	// The store's client retries for ~10 s, which would only delay a
	// configuration error; one quick retry is enough for a flaky start.
	popts := *mopts
	popts.MaxRetries = 2
	probe, err := minio.New(host, &popts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	scheme := "http"
	if secure {
		scheme = "https"
	}
	s := &S3{client: client, bucket: bucket, prefix: prefix, region: opts.Region, endpoint: scheme + "://" + host}
	if err := s.check(ctx, probe); err != nil {
		return nil, err
	}
	return s, nil
}

func s3Name(bucket, prefix string) string {
	prefix = strings.Trim(prefix, "/")
	if prefix == "" {
		return "s3://" + bucket
	}
	return "s3://" + bucket + "/" + prefix
}

func checkBucket(bucket string) error {
	if bucket == "" {
		return errors.New("empty bucket name")
	}
	if err := s3utils.CheckValidBucketNameStrict(bucket); err != nil {
		return fmt.Errorf("invalid bucket name %q: %v", redactURL(bucket), err)
	}
	return nil
}

// check makes one HEAD request on the bucket through probe and turns its
// failure into a message that names what to fix.
func (s *S3) check(ctx context.Context, probe *minio.Client) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, S3OpenTimeout)
	defer cancel()
	ok, err := probe.BucketExists(ctx, s.bucket)
	if err == nil && !ok {
		return fmt.Errorf("%s: bucket %q does not exist at %s", s, s.bucket, s.endpoint)
	}
	if err == nil {
		s.sawBucket()
		return nil
	}
	return s.describeOpenError(ctx, err, time.Since(start))
}

func (s *S3) describeOpenError(ctx context.Context, err error, took time.Duration) error {
	var (
		resp   = minio.ToErrorResponse(err)
		opErr  *net.OpError
		dnsErr *net.DNSError
		x509U  x509.UnknownAuthorityError
		x509H  x509.HostnameError
		recErr tls.RecordHeaderError
	)
	switch {
	case resp.Code == "NoSuchBucket":
		return fmt.Errorf("%s: bucket %q does not exist at %s", s, s.bucket, s.endpoint)
	case resp.Region != "" && resp.Region != s.region && (resp.StatusCode == 301 || resp.Code == "AuthorizationHeaderMalformed" || resp.Code == "PermanentRedirect"):
		return fmt.Errorf("%s: bucket %q is in region %s: set AWS_REGION=%s", s, s.bucket, resp.Region, resp.Region)
	case resp.StatusCode == 403 || isAuthCode(resp.Code):
		return fmt.Errorf("%s: access denied at %s: check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and the bucket policy): %w", s, s.endpoint, err)
	case resp.StatusCode != 0:
		return fmt.Errorf("%s: checking bucket %q at %s: %w", s, s.bucket, s.endpoint, err)
	case errors.As(err, &x509U), errors.As(err, &x509H), errors.As(err, &recErr),
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("%s: TLS to %s failed (a plain-HTTP server needs an http:// endpoint): %w", s, s.endpoint, err)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("%s: endpoint unreachable (%s): %v", s, s.endpoint, dnsErr)
	case errors.As(err, &opErr):
		return fmt.Errorf("%s: endpoint unreachable (%s): %v", s, s.endpoint, opErr)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: endpoint unreachable (%s): no answer after %v: %w", s, s.endpoint, took.Round(time.Millisecond), ctx.Err())
	default:
		return fmt.Errorf("%s: checking bucket %q at %s: %w", s, s.bucket, s.endpoint, err)
	}
}

func isAuthCode(code string) bool {
	switch code {
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "InvalidClientTokenId":
		return true
	}
	return false
}

func (s *S3) String() string { return s3Name(s.bucket, s.prefix) }

func (s *S3) objectName(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return s.fullName(key), nil
}

// wrap maps a minio-go error to ErrNotFound where the object is missing,
// and to a 503 (errdefs.KindUnavailable) of ErrNoBucket or ErrAccessDenied
// where the bucket is gone or the service refuses the credentials: the
// server's configuration, never a missing object. Either way the message
// names the store (bucket and prefix) and the object's name in the bucket,
// so that an operator with several buckets knows where to look.
func (s *S3) wrap(op, key string, err error) error {
	what := s.what(op, key)
	if e := s.classify(what, err); e != nil {
		return e
	}
	if code := minio.ToErrorResponse(err).Code; code == "NoSuchKey" {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// wrapHead is wrap for a HEAD request (Stat, and the first request of Get
// and GetTagged). A HEAD answer has no body, so AWS's 404 for an object of
// a bucket that no longer exists carries no error code and minio-go reads
// it as NoSuchKey: the bucket is asked after (a HEAD on it, whose bare 404
// is NoSuchBucket) before the object is reported missing, unless a
// request found the bucket there within bucketTTL (every lookup of an
// unknown function name would cost two requests otherwise). So a bucket
// deleted while remembered reads as missing objects on HEADs for at most
// bucketTTL, or until any request gets NoSuchBucket (classify forgets the
// bucket then). A bucket check that fails for another reason (a 5xx, a
// deadline) leaves the object's answer, not found, and is not remembered.
func (s *S3) wrapHead(ctx context.Context, op, key string, err error) error {
	if minio.ToErrorResponse(err).Code != "NoSuchKey" {
		return s.wrap(op, key, err)
	}
	ok, berr := s.bucketThere(ctx)
	switch {
	case berr != nil:
		what := s.what(op, key)
		if e := s.classify(what, berr); e != nil {
			return e
		}
		return fmt.Errorf("%s: %w (whether bucket %q is there could not be checked: %w)", what, ErrNotFound, s.bucket, berr)
	case !ok:
		return s.noBucket(op, key)
	}
	return s.wrap(op, key, err)
}

// bucketThere is whether the bucket is there: remembered for bucketTTL
// from the last request that found it, asked (a HEAD on it) past that.
func (s *S3) bucketThere(ctx context.Context) (bool, error) {
	if s.bucketFresh() {
		return true, nil
	}
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err == nil && ok {
		s.sawBucket()
	}
	return ok, err
}

// noBucket is op on key's error where the bucket is found gone.
func (s *S3) noBucket(op, key string) error {
	return s.wrap(op, key, minio.ErrorResponse{StatusCode: 404, Code: "NoSuchBucket", Message: "The specified bucket does not exist", BucketName: s.bucket})
}

// bucketFresh is whether a request found the bucket there within
// bucketTTL.
func (s *S3) bucketFresh() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.bucket0.IsZero() && s.clock().Sub(s.bucket0) < bucketTTL
}

// what names an operation on key: the store, the object and the bucket.
func (s *S3) what(op, key string) string {
	return fmt.Sprintf("%s %s: %s: object %q in bucket %q", op, key, s, s.fullName(key), s.bucket)
}

// classify is the 503 of a bucket that does not exist, of access denied,
// of an archived object or of a clock too far off (the last two are 403s
// too, with their own codes; a HEAD's 403 has no code and reads as access
// denied), what being the operation and where; nil for any other error.
func (s *S3) classify(what string, err error) error {
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == "NoSuchBucket":
		s.mu.Lock()
		s.bucket0 = time.Time{} // the next HEAD's 404 asks the bucket again
		s.mu.Unlock()
		return errdefs.New(errdefs.KindUnavailable, fmt.Errorf("%w: %w", ErrNoBucket, err),
			"%s: bucket %q does not exist at %s (deleted or renamed since the server started?)", what, s.bucket, s.endpoint)
	case resp.Code == "InvalidObjectState":
		// A 403, but no denial: the object's storage class (S3 Glacier,
		// Deep Archive) cannot be read or copied until it is restored.
		return errdefs.New(errdefs.KindUnavailable, err,
			"%s: the object is archived (InvalidObjectState: a storage class such as S3 Glacier, often set by a lifecycle rule of bucket %q) at %s: restore it or copy it back to a readable storage class", what, s.bucket, s.endpoint)
	case resp.Code == "RequestTimeTooSkewed":
		// A 403, but no denial: the request's signed time is too far
		// from the service's (more than 15 minutes on AWS).
		return errdefs.New(errdefs.KindUnavailable, err,
			"%s: bucket %q at %s refused the request's time: this host's clock is too far from the service's: sync the clock (NTP)", what, s.bucket, s.endpoint)
	case resp.StatusCode == 403 || isAuthCode(resp.Code):
		return errdefs.New(errdefs.KindUnavailable, fmt.Errorf("%w: %w", ErrAccessDenied, err),
			"%s: access to bucket %q denied at %s: check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) and the bucket policy", what, s.bucket, s.endpoint)
	}
	return nil
}

// fullName is key's object name in the bucket (under the prefix).
func (s *S3) fullName(key string) string {
	if s.prefix == "" {
		return key
	}
	return s.prefix + "/" + key
}

func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	defer func() { err = fault(err) }()
	name, err := s.objectName(key)
	if err != nil {
		return err
	}
	body, err := exactBody(ctx, r, size)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	if size < 0 {
		opts.PartSize = unknownSizePartSize
	}
	if _, err := s.client.PutObject(ctx, s.bucket, name, body, size, opts); err != nil {
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			return fmt.Errorf("put %s: %w (%w)", key, cerr, err)
		}
		return s.wrap("put", key, err)
	}
	s.sawBucket()
	return nil
}

// exactBody returns what to hand minio-go for a Put of size bytes. minio-go
// stops reading at size, so a reader holding more would be silently
// truncated; the filesystem store refuses that, and so must this one.
//
// A reader that can seek is checked up front and passed through unwrapped,
// because minio-go only retries a request whose body it can rewind and only
// uploads parts in parallel from an io.ReaderAt.
func exactBody(ctx context.Context, r io.Reader, size int64) (io.Reader, error) {
	if size < 0 {
		return ctxReader{ctx, r}, nil
	}
	if rs, ok := r.(io.ReadSeeker); ok {
		if cur, err := rs.Seek(0, io.SeekCurrent); err == nil && cur == 0 {
			end, err := rs.Seek(0, io.SeekEnd)
			if err != nil {
				return nil, err
			}
			if _, err := rs.Seek(0, io.SeekStart); err != nil {
				return nil, err
			}
			if end != size {
				return nil, fmt.Errorf("got %d bytes, expected %d", end, size)
			}
			return r, nil
		}
	}
	return &exactReader{ctx: ctx, r: r, size: size, left: size}, nil
}

// exactReader yields exactly size bytes of r and fails, before handing over
// the last of them, if r is shorter or longer, so that the upload aborts
// instead of completing with the wrong content.
type exactReader struct {
	ctx        context.Context
	r          io.Reader
	size, left int64
	done       bool
}

func (e *exactReader) Read(p []byte) (int, error) {
	if err := e.ctx.Err(); err != nil {
		return 0, err
	}
	if e.left == 0 {
		if !e.done {
			if err := e.probeEnd(); err != nil {
				return 0, err
			}
		}
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if e.left == 0 {
		if perr := e.probeEnd(); perr != nil {
			return 0, perr
		}
		return n, nil
	}
	if err == io.EOF {
		return n, fmt.Errorf("got %d bytes, expected %d: %w", e.size-e.left, e.size, io.ErrUnexpectedEOF)
	}
	return n, err
}

func (e *exactReader) probeEnd() error {
	e.done = true
	var one [1]byte
	n, err := io.ReadFull(e.r, one[:])
	if n > 0 {
		return fmt.Errorf("reader holds more than the %d bytes expected", e.size)
	}
	if err != nil && err != io.EOF {
		return err
	}
	return nil
}

func (s *S3) Get(ctx context.Context, key string) (_ io.ReadCloser, err error) {
	defer func() { err = fault(err) }()
	name, err := s.objectName(key)
	if err != nil {
		return nil, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	// GetObject is lazy; Stat sends the GET so that a missing object is
	// reported here rather than at the caller's first Read.
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		return nil, s.wrapHead(ctx, "get", key, err)
	}
	s.sawBucket()
	return faultReader{obj}, nil
}

// faultReader marks the errors of a read of an object's body (Fault).
type faultReader struct{ *minio.Object }

func (r faultReader) Read(p []byte) (int, error) {
	n, err := r.Object.Read(p)
	return n, fault(err)
}

func (s *S3) GetTagged(ctx context.Context, key string) (_ io.ReadCloser, _ Info, err error) {
	defer func() { err = fault(err) }()
	name, err := s.objectName(key)
	if err != nil {
		return nil, Info{}, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return nil, Info{}, s.wrap("get", key, err)
	}
	oi, err := obj.Stat()
	if err != nil {
		obj.Close()
		return nil, Info{}, s.wrapHead(ctx, "get", key, err)
	}
	s.sawBucket()
	return &tagReader{obj: obj, key: key}, Info{Key: key, Size: oi.Size, ModTime: oi.LastModified, ETag: oi.ETag}, nil
}

// tagReader reports a read of an object that was replaced after GetTagged
// returned (minio-go conditions its reads on the ETag it saw) as
// ErrPrecondition: the caller read a version that is gone, and should read
// again. One deleted since (GetTagged's HEAD found it, the GET that reads
// it does not: NoSuchKey) is ErrNotFound, as if it had been gone before:
// a record deleted elsewhere is no store failure, which failed every
// listing that read it.
type tagReader struct {
	obj *minio.Object
	key string
}

func (r *tagReader) Read(p []byte) (int, error) {
	n, err := r.obj.Read(p)
	if err != nil && err != io.EOF {
		switch resp := minio.ToErrorResponse(err); {
		case resp.StatusCode == 412 || resp.Code == "PreconditionFailed":
			return n, fault(fmt.Errorf("get %s: replaced while read: %w", r.key, ErrPrecondition))
		case resp.Code == "NoSuchKey":
			return n, fault(fmt.Errorf("get %s: deleted while read: %w", r.key, ErrNotFound))
		}
	}
	return n, fault(err)
}

func (r *tagReader) Close() error { return r.obj.Close() }

// PutIf sends the condition with the PUT (If-None-Match: * or If-Match:
// ETAG), which AWS S3 and MinIO evaluate atomically; 412 is the refusal,
// and AWS's 409 ConditionalRequestConflict (another write or a delete of
// the key in flight, to be retried) a lost race too: the caller reads
// again.
func (s *S3) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) (err error) {
	defer func() { err = fault(err) }()
	name, err := s.objectName(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("put %s: a conditional write needs the size", key)
	}
	body, err := exactBody(ctx, r, size)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	if ifMatch == "" {
		opts.SetMatchETagExcept("*")
	} else {
		opts.SetMatchETag(ifMatch)
	}
	if _, err := s.client.PutObject(ctx, s.bucket, name, body, size, opts); err != nil {
		if resp := minio.ToErrorResponse(err); resp.StatusCode == 412 || resp.Code == "PreconditionFailed" || resp.Code == "ConditionalRequestConflict" {
			s.sawBucket() // the condition was evaluated on the bucket's object
			return fmt.Errorf("put %s: %w", key, ErrPrecondition)
		}
		if e := s.classify(s.what("put", key), err); e != nil {
			return e // a missing bucket is no lost race
		}
		if resp := minio.ToErrorResponse(err); ifMatch != "" && (resp.Code == "NoSuchKey" || resp.StatusCode == 404) {
			// A store could answer so for a bucket deleted a moment ago
			// (a CI failure once looked like it; more likely a force
			// delete finishing late): asked, a missing bucket is no
			// lost race.
			if ok, berr := s.bucketThere(ctx); berr == nil && !ok {
				return s.noBucket("put", key)
			}
			return fmt.Errorf("put %s: it no longer exists: %w", key, ErrPrecondition)
		}
		return s.wrap("put", key, err)
	}
	s.sawBucket()
	return nil
}

// Touch copies the object onto itself with new metadata (a server-side
// copy; S3 refuses a self-copy that changes nothing), which resets its
// modification time.
func (s *S3) Touch(ctx context.Context, key string) (err error) {
	defer func() { err = fault(err) }()
	name, err := s.objectName(key)
	if err != nil {
		return err
	}
	dst := minio.CopyDestOptions{Bucket: s.bucket, Object: name, ReplaceMetadata: true,
		UserMetadata: map[string]string{"Plover-Touched": time.Now().UTC().Format(time.RFC3339Nano)}}
	if _, err := s.client.CopyObject(ctx, dst, minio.CopySrcOptions{Bucket: s.bucket, Object: name}); err != nil {
		return s.wrap("touch", key, err)
	}
	s.sawBucket()
	return nil
}

func (s *S3) Stat(ctx context.Context, key string) (_ Info, err error) {
	defer func() { err = fault(err) }()
	name, err := s.objectName(key)
	if err != nil {
		return Info{}, err
	}
	oi, err := s.client.StatObject(ctx, s.bucket, name, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.wrapHead(ctx, "stat", key, err)
	}
	s.sawBucket()
	return Info{Key: key, Size: oi.Size, ModTime: oi.LastModified, ETag: oi.ETag}, nil
}

// maxListed bounds the objects one List reads, in or out of its prefix:
// a node's store holds a record and a bundle or two a function, and
// thousands of functions; a var for tests.
var maxListed = 1 << 20

func (s *S3) List(ctx context.Context, prefix string) (_ []Info, err error) {
	defer func() { err = fault(err) }()
	full := prefix
	if s.prefix != "" {
		full = s.prefix + "/" + prefix
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine if we return early
	var out []Info
	listed := 0
	for oi := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: full, Recursive: true}) {
		if oi.Err != nil {
			what := fmt.Sprintf("list %q: %s", prefix, s)
			if e := s.classify(what, oi.Err); e != nil {
				return nil, e
			}
			return nil, fmt.Errorf("%s: bucket %q: %w", what, s.bucket, oi.Err)
		}
		// minio-go follows pages as long as the endpoint says there are
		// more: one that repeats its continuation token listed 500,000
		// keys in 5 s, kept here until the node ran out of memory.
		if listed++; listed > maxListed {
			return nil, fmt.Errorf("list %q: %s: bucket %q: over %d objects listed (an endpoint repeating its pages, or a bucket prefix shared with other data)", prefix, s, s.bucket, maxListed)
		}
		// An endpoint (a gateway, a cache keyed by path) may ignore the
		// prefix asked for: an object outside it is never this listing's,
		// or gc would take a function's record for an unused bundle.
		if !strings.HasPrefix(oi.Key, full) {
			continue
		}
		key := oi.Key
		if s.prefix != "" {
			key = strings.TrimPrefix(key, s.prefix+"/")
		}
		// Objects written by other tools may not be valid keys; the
		// filesystem store skips such names too.
		if CheckKey(key) != nil {
			continue
		}
		out = append(out, Info{Key: key, Size: oi.Size, ModTime: oi.LastModified, ETag: oi.ETag})
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	s.sawBucket()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (s *S3) Delete(ctx context.Context, key string) (err error) {
	defer func() { err = fault(err) }()
	name, err := s.objectName(key)
	if err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, name, minio.RemoveObjectOptions{}); err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return nil
		}
		return s.wrap("delete", key, err)
	}
	s.sawBucket()
	return nil
}
