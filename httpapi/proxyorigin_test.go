package httpapi_test

import (
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// README's advice behind a reverse proxy on the same machine: "have the
// proxy send Host: localhost". The console, opened at the proxy's name,
// then sends its own origin, which is not Host: every POST, PUT and
// DELETE it made was 403, though the browser says same-origin. A browser's
// Sec-Fetch-Site now decides where it is sent.
func TestConsoleBehindAProxySendingHostLocalhost(t *testing.T) {
	adm := csrfAdmin{rollbacks: new(atomic.Int32), gcs: new(atomic.Int32), deletes: new(atomic.Int32)}
	base := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{}))
	code, body := send(t, "POST", base+"/v1/functions/f/rollback", "application/json", `{"version":"0123456789abcdef"}`,
		map[string]string{"Host": "localhost", "Origin": "https://plover.example.com", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"})
	if code != 200 {
		t.Errorf("the console's rollback through a proxy sending Host: localhost (as README advises): %d %s", code, body)
	}
}
