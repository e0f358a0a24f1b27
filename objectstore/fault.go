package objectstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"

	"github.com/minio/minio-go/v7"
)

// Fault is an S3 store's error as a client may be told it: Class says what
// failed ("the object store did not answer in time") and names no bucket,
// prefix, object, endpoint or URL; Err, which its Error gives, says where,
// for the server's log. Every error an S3 store returns, its readers' too,
// is one, so that the one place that turns a store's failure into a
// client's answer (the engine's) tells the client its class and the log
// the rest. (A file store's errors name paths on the server alone.)
type Fault struct {
	Class string
	Err   error
}

func (f *Fault) Error() string { return f.Err.Error() }
func (f *Fault) Unwrap() error { return f.Err }

// ClassOf is the Class of the Fault in err's chain ("": none, the error is
// no S3 store's).
func ClassOf(err error) string {
	var f *Fault
	if errors.As(err, &f) {
		return f.Class
	}
	return ""
}

// fault marks err, an S3 store's, with its class (nil stays nil).
func fault(err error) error {
	var f *Fault
	if err == nil || err == io.EOF || errors.As(err, &f) {
		return err
	}
	return &Fault{Class: faultClass(err), Err: err}
}

// faultClass is what failed in err, without where.
func faultClass(err error) string {
	var (
		resp   minio.ErrorResponse
		dnsErr *net.DNSError
		opErr  *net.OpError
		x509U  x509.UnknownAuthorityError
		x509H  x509.HostnameError
		recErr tls.RecordHeaderError
	)
	isResp := errors.As(err, &resp) && resp.StatusCode != 0
	switch {
	case errors.Is(err, ErrNoBucket):
		return "the object store's bucket does not exist (deleted or renamed since the server started?)"
	case isResp && resp.Code == "InvalidObjectState":
		return "the object is archived in the store (a storage class such as S3 Glacier): it must be restored"
	case isResp && resp.Code == "RequestTimeTooSkewed":
		return "the object store refused the request's time: the server's clock is off"
	case errors.Is(err, ErrAccessDenied):
		return "the object store refused the server's credentials"
	case errors.Is(err, ErrNotFound):
		return "the object is not in the store"
	case errors.Is(err, ErrPrecondition):
		return "the object changed in the store while it was written"
	case errors.Is(err, context.DeadlineExceeded):
		return "the object store did not answer in time"
	case errors.Is(err, context.Canceled):
		return "the request to the object store was cancelled"
	case isResp:
		return fmt.Sprintf("the object store answered %d %s", resp.StatusCode, codeWord(resp.Code, resp.StatusCode))
	case errors.As(err, &x509U), errors.As(err, &x509H), errors.As(err, &recErr):
		return "TLS to the object store failed"
	case errors.As(err, &dnsErr):
		return "the object store did not answer: its host name does not resolve"
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.Is(err, syscall.ECONNREFUSED):
		return "the object store did not answer: no connection could be made"
	case errors.As(err, &opErr), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return "the connection to the object store failed"
	}
	return "the object store failed"
}

// codeWord is an S3 error code as a client may read it: a word of letters
// and digits (the service sent it), else the status's text.
func codeWord(code string, status int) string {
	if code == "" || len(code) > 64 {
		return http.StatusText(status)
	}
	for _, c := range code {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return http.StatusText(status)
		}
	}
	return code
}
