package httpapi_test

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A malformed request that carries a bearer token: fasthttp's parse error
// quoted the request's raw header bytes, and the server sent that text
// back in its 400 and, at --log-level debug, wrote it to its log, so the
// token landed in logs (the server's, and those of any proxy that records
// error bodies). README: "tokens are never stored in clear".
func TestMalformedRequestEchoesNoToken(t *testing.T) {
	const secret = "secret-token-value-never-echoed"
	tab, err := auth.Parse(strings.NewReader("ops admin "+auth.Hash(secret)+"\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	var log testkit.LogBuffer
	e := testkit.Engine(t, engine.Config{})
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{
		Log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /v1/functions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "+secret+"\r\nContent-Length: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	answer, _ := io.ReadAll(bufio.NewReader(c))
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(log.String(), "error when reading request headers") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Contains(string(answer), secret) {
		t.Errorf("the 400 for a malformed request quotes its bearer token:\n%.600s", answer)
	}
	if strings.Contains(log.String(), secret) {
		t.Errorf("the server's log (debug) holds the bearer token:\n%.600s", log.String())
	}
}
