package auth_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/plover-run/plover/auth"
)

func hash(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }

var (
	hA = hash("token-a")
	hB = hash("token-b")
)

func TestScopeString(t *testing.T) {
	tests := []struct {
		s    auth.Scope
		want string
	}{
		{auth.Read, "read"},
		{auth.Invoke, "invoke"},
		{auth.Deploy, "deploy"},
		{auth.Admin, "admin"},
		{auth.Invoke | auth.Read, "read,invoke"},
		{auth.Admin | auth.Deploy | auth.Invoke | auth.Read, "read,invoke,deploy,admin"},
		{0, "none"},
		{auth.Read | 0x10, "read,0x10"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("Scope(%d).String() = %q, want %q", uint8(tt.s), got, tt.want)
		}
	}
}

func TestParseScopes(t *testing.T) {
	tests := []struct {
		in      string
		want    auth.Scope
		wantErr string
	}{
		{"read", auth.Read, ""},
		{"invoke,read", auth.Invoke | auth.Read, ""},
		{"read,invoke", auth.Invoke | auth.Read, ""},
		{"admin,deploy,invoke,read", auth.Admin | auth.Deploy | auth.Invoke | auth.Read, ""},
		{"deploy,deploy", auth.Deploy, ""},
		{"", 0, "no scopes"},
		{"read,", 0, "empty scope"},
		{"invoke,write", 0, `unknown scope "write"`},
		{"Read", 0, `unknown scope "Read"`},
		{"none", 0, `unknown scope "none"`},
	}
	for _, tt := range tests {
		got, err := auth.ParseScopes(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseScopes(%q) = %v, %v; want error %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseScopes(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		// String and ParseScopes round-trip.
		if back, err := auth.ParseScopes(got.String()); err != nil || back != got {
			t.Errorf("ParseScopes(%q) = %v, %v", got.String(), back, err)
		}
	}
}

func TestParse(t *testing.T) {
	file := "# Plover tokens\n" +
		"\n" +
		"ci\tinvoke,read\t" + hA + "\tcnn,vec*   # the CI runner\n" +
		"   ops  admin  " + hB + "\r\n" +
		"  # indented comment\n" +
		"\t\n"
	tab, err := auth.Parse(strings.NewReader(file), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	if tab.Len() != 2 {
		t.Fatalf("Len = %d, want 2", tab.Len())
	}
	ci := tab.Lookup([]byte("token-a"))
	want := &auth.Principal{Name: "ci", Scopes: auth.Invoke | auth.Read, Functions: []string{"cnn", "vec*"}}
	if !reflect.DeepEqual(ci, want) {
		t.Errorf("ci = %+v, want %+v", ci, want)
	}
	ops := tab.Lookup([]byte("token-b"))
	want = &auth.Principal{Name: "ops", Scopes: auth.Admin, Functions: []string{"*"}}
	if !reflect.DeepEqual(ops, want) {
		t.Errorf("ops = %+v, want %+v (FUNCTIONS defaults to *)", ops, want)
	}
}

func TestParseLimits(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want auth.Limits
	}{
		{"rate=50", auth.Limits{Rate: 50, Burst: 50}},
		{"rate=2.5/s", auth.Limits{Rate: 2.5, Burst: 3}},
		{"rate=0.1", auth.Limits{Rate: 0.1, Burst: 1}},
		{"burst=100,rate=50", auth.Limits{Rate: 50, Burst: 100}},
		{"concurrency=8", auth.Limits{Concurrency: 8}},
		{"rate=10,burst=20,concurrency=4", auth.Limits{Rate: 10, Burst: 20, Concurrency: 4}},
	} {
		got, err := auth.ParseLimits(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseLimits(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		// The auth file's line round-trips.
		line := auth.Line("x", auth.Invoke, hA, nil, got)
		tab, err := auth.Parse(strings.NewReader(line), "line")
		if err != nil || tab.Lookup([]byte("token-a")).Limits != got {
			t.Errorf("%q: line %q does not round-trip: %v", tt.in, line, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	long := strings.Repeat("n", 65)
	tests := []struct {
		name, file, want string
	}{
		{"empty", "", "f: no tokens"},
		{"only comments", "# nothing\n\n   \n", "f: no tokens"},
		{"one field", "ci\n", `f:1: one field alone, 2 characters: missing SCOPES and SHA256`},
		{"two fields", "# c\nci read\n", "f:2: missing SHA256"},
		{"five fields, bad limits", "ci read " + hA + " a b\n", `f:1: LIMITS: "b": want key=value`},
		{"six fields", "ci read " + hA + " a rate=1 c\n", `f:1: extra field "c" after LIMITS`},
		{"prose", "Append this line to the server's auth file\n", `f:1: not a token line: SCOPES "this": `},
		{"unknown limit", "ci read " + hA + " * rps=1\n", `f:1: LIMITS: unknown limit "rps"`},
		{"zero rate", "ci read " + hA + " * rate=0\n", `f:1: LIMITS: rate "0": want requests per second`},
		{"burst without rate", "ci read " + hA + " * burst=5\n", `f:1: LIMITS: burst needs a rate`},
		{"bad concurrency", "ci read " + hA + " * concurrency=0\n", `f:1: LIMITS: concurrency "0"`},
		{"limit twice", "ci read " + hA + " * rate=1,rate=2\n", `f:1: LIMITS: rate given twice`},
		{"bad name char", "c/i read " + hA + "\n", `f:1: NAME: name "c/i" has '/'`},
		{"hash in name", "c#i read " + hA + "\n", `f:1: NAME: name "c#i" has '#'`},
		{"long name", long + " read " + hA + "\n", "f:1: NAME: name \"" + long + "\" is longer than 64"},
		{"duplicate name", "ci read " + hA + "\nci read " + hB + "\n", `f:2: NAME: duplicate name "ci" (also on line 1)`},
		{"unknown scope", "ci read,write " + hA + "\n", `f:1: SCOPES: unknown scope "write"`},
		{"empty scope", "ci read,,invoke " + hA + "\n", `f:1: SCOPES: empty scope`},
		{"short hash", "ci read abc\n", `f:1: SHA256: is 3 characters, want 64 hex`},
		{"upper hash", "ci read " + strings.ToUpper(hA) + "\n", `f:1: SHA256: has uppercase letters: want lowercase hex`},
		{"non-hex hash", "ci read " + strings.Repeat("g", 64) + "\n", `f:1: SHA256: has a character that is not hex at position 1`},
		{"duplicate hash", "ci read " + hA + "\n\nops admin " + hA + "\n", "f:3: SHA256: duplicate hash (the same token as line 1)"},
		{"the empty token's hash", "ci read e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n", "f:1: SHA256: the hash of the empty token"},
		{"bad glob", "ci invoke " + hA + " cnn,vec[\n", `f:1: FUNCTIONS: glob "vec["`},
		{"empty glob", "ci invoke " + hA + " cnn,,vec\n", `f:1: FUNCTIONS: empty glob`},
		{"trailing comma glob", "ci invoke " + hA + " cnn,\n", `f:1: FUNCTIONS: empty glob`},
		{"second line bad", "ops admin " + hB + "\nci invoke " + hA + " a\\\n", `f:2: FUNCTIONS: glob "a\\"`},
		{"too long line", strings.Repeat("x", 70<<10), "f:1: line too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, err := auth.Parse(strings.NewReader(tt.file), "f")
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("Parse = %v, %v; want error starting %q", tab, err, tt.want)
			}
		})
	}
}

func TestAllow(t *testing.T) {
	const (
		R = auth.Read
		I = auth.Invoke
		D = auth.Deploy
		A = auth.Admin
	)
	all := []string{"*"}
	some := []string{"cnn", "vec*"}
	tests := []struct {
		scopes auth.Scope
		funcs  []string
		need   auth.Scope
		fn     string
		want   string // "" allowed, else the Denied message
	}{
		// Each scope against each need, all functions.
		{R, all, R, "", ""},
		{R, all, R, "cnn", ""},
		{R, all, I, "cnn", `token "t" lacks the "invoke" scope`},
		{R, all, D, "cnn", `token "t" lacks the "deploy" scope`},
		{R, all, A, "", `token "t" lacks the "admin" scope`},
		{I, all, R, "", `token "t" lacks the "read" scope`},
		{I, all, I, "cnn", ""},
		{I, all, D, "cnn", `token "t" lacks the "deploy" scope`},
		{I, all, A, "", `token "t" lacks the "admin" scope`},
		{D, all, R, "", ""}, // Deploy implies Read
		{D, all, I, "cnn", `token "t" lacks the "invoke" scope`},
		{D, all, D, "cnn", ""},
		{D, all, A, "", `token "t" lacks the "admin" scope`},
		{A, all, R, "", ""},
		{A, all, I, "cnn", ""},
		{A, all, D, "cnn", ""},
		{A, all, A, "", ""},
		{I | R, all, R, "", ""},
		{I | D, all, I, "x", ""},
		{I | D, all, D, "x", ""},

		// Globs.
		{R, some, R, "", ""},    // a listing: not limited by Functions
		{R, some, R, "cnn", ""}, // a function's own (its logs): limited
		{R, some, R, "other", `token "t" may read only functions matching "cnn", "vec*": not "other"`},
		{I, some, I, "cnn", ""},
		{I, some, I, "vecadd", ""},
		{I, some, I, "vec", ""},
		{I, some, I, "other", `token "t" may invoke only functions matching "cnn", "vec*": not "other"`},
		{I, some, I, "cnn2", `token "t" may invoke only functions matching "cnn", "vec*": not "cnn2"`},
		{D, some, D, "vecadd", ""},
		{D, some, D, "other", `token "t" may deploy only functions matching "cnn", "vec*": not "other"`},
		{D, some, R, "", ""}, // globs do not limit a listing
		{D, some, R, "other", `token "t" may read only functions matching "cnn", "vec*": not "other"`}, // but a function's own output
		{A, some, D, "other", ""}, // admin ignores globs
		{A, some, I, "other", ""}, // admin ignores globs
		{I, some, D, "cnn", `token "t" lacks the "deploy" scope`},
		{I, []string{"v?c"}, I, "vec", ""},
		{I, []string{"v?c"}, I, "veec", `token "t" may invoke only functions matching "v?c": not "veec"`},
		{I, nil, I, "anything", ""}, // empty list is "*"

		// Store-wide deploy (gc): admin or exactly ["*"].
		{D, all, D, "", ""},
		{D, nil, D, "", ""},
		{A, some, D, "", ""},
		{D, some, D, "", `token "t" may deploy only functions matching "cnn", "vec*": store-wide operations need the "admin" scope or functions "*"`},
		{D, []string{"*", "cnn"}, D, "", `store-wide operations need`},
		{D, []string{"v*"}, D, "", `store-wide operations need`},
		{R, all, D, "", `token "t" lacks the "deploy" scope`},

		// need is one scope.
		{A, all, R | I, "", "Allow needs one scope"},
		{A, all, 0, "", "Allow needs one scope"},
		{A, all, 0x10, "", "Allow needs one scope"},
	}
	for _, tt := range tests {
		p := &auth.Principal{Name: "t", Scopes: tt.scopes, Functions: tt.funcs}
		err := p.Allow(tt.need, tt.fn)
		if tt.want == "" {
			if err != nil {
				t.Errorf("%v %q: Allow(%v, %q) = %v, want nil", tt.scopes, tt.funcs, tt.need, tt.fn, err)
			}
			continue
		}
		var d *auth.Denied
		if !errors.As(err, &d) || !strings.Contains(d.Error(), tt.want) {
			t.Errorf("%v %q: Allow(%v, %q) = %v, want *Denied %q", tt.scopes, tt.funcs, tt.need, tt.fn, err, tt.want)
		}
	}
	var nilP *auth.Principal
	if err := nilP.Allow(auth.Read, ""); err == nil {
		t.Error("nil principal allowed")
	}
}

func table(t *testing.T, file string) *auth.Table {
	t.Helper()
	tab, err := auth.Parse(strings.NewReader(file), "t")
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func TestLookup(t *testing.T) {
	tab := table(t, "a read "+hA+"\nb invoke "+hB+" x*\n")
	tests := []struct {
		token, want string
	}{
		{"token-a", "a"},
		{"token-b", "b"},
		{"token-c", ""},
		{"", ""},
		{"token-a ", ""},
		{hA, ""}, // the hash is not the token
	}
	for _, tt := range tests {
		p := tab.Lookup([]byte(tt.token))
		switch {
		case tt.want == "" && p != nil:
			t.Errorf("Lookup(%q) = %q, want nil", tt.token, p.Name)
		case tt.want != "" && (p == nil || p.Name != tt.want):
			t.Errorf("Lookup(%q) = %v, want %q", tt.token, p, tt.want)
		}
	}
	var nilT *auth.Table
	if nilT.Lookup([]byte("token-a")) != nil || nilT.Len() != 0 {
		t.Error("nil table")
	}
}

func TestLookupAllocs(t *testing.T) {
	tab := table(t, "a read "+hA+"\nb invoke "+hB+" x*\n")
	hit, miss := []byte("token-b"), []byte("token-zzz")
	for name, tok := range map[string][]byte{"hit": hit, "miss": miss} {
		if n := testing.AllocsPerRun(100, func() { tab.Lookup(tok) }); n != 0 {
			t.Errorf("Lookup %s: %v allocations, want 0", name, n)
		}
	}
	hdr := []byte("Bearer token-a")
	if n := testing.AllocsPerRun(100, func() { auth.BearerToken(hdr) }); n != 0 {
		t.Errorf("BearerToken: %v allocations, want 0", n)
	}
}

func BenchmarkLookup(b *testing.B) {
	var file strings.Builder
	for i := range 100 {
		file.WriteString(auth.Line("t"+string(rune('a'+i%26))+strings.Repeat("x", i/26), auth.Invoke, hash(string(rune(i))), nil, auth.Limits{}) + "\n")
	}
	tab, err := auth.Parse(strings.NewReader(file.String()), "b")
	if err != nil {
		b.Fatal(err)
	}
	tok := []byte("some-token-that-does-not-match-anything")
	b.ReportAllocs()
	for b.Loop() {
		tab.Lookup(tok)
	}
}

func TestStoreReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a read " + hA + "\n")
	if _, err := auth.Load(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
	s, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.Path() != path || s.Len() != 1 || s.Lookup([]byte("token-a")) == nil || s.Lookup([]byte("token-b")) != nil {
		t.Fatalf("after Load: path %q, len %d", s.Path(), s.Len())
	}

	// A good reload replaces the table.
	write("b invoke " + hB + "\n")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.Lookup([]byte("token-a")) != nil || s.Lookup([]byte("token-b")) == nil {
		t.Fatal("Reload did not replace the table")
	}

	// A bad file (naming the old token), an empty one or a missing one
	// keeps the old table (one of comments alone refuses every token:
	// TestAReloadRevokesWhatTheFileNoLongerNames).
	for _, bad := range []string{"b invoke " + hB + "\nc bogus " + hA + "\n", ""} {
		write(bad)
		if err := s.Reload(); err == nil {
			t.Fatalf("Reload of %q succeeded", bad)
		} else if bad != "" && !strings.HasPrefix(err.Error(), path+":") {
			t.Errorf("Reload error %q does not name the file", err)
		}
		if p := s.Lookup([]byte("token-b")); p == nil || p.Name != "b" {
			t.Fatalf("after a bad Reload (%q) the old table is gone", bad)
		}
	}
	os.Remove(path)
	if err := s.Reload(); err == nil {
		t.Fatal("Reload of a missing file succeeded")
	}
	if s.Lookup([]byte("token-b")) == nil {
		t.Fatal("after Reload of a missing file the old table is gone")
	}
}

func TestBearerToken(t *testing.T) {
	tests := []struct {
		header, want string
		ok           bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER abc", "abc", true},
		{"bEaReR a-b_c.d~e+f/g==", "a-b_c.d~e+f/g==", true},
		{"Bearer    abc", "abc", true},
		{"Bearer abc  ", "abc", true},
		{"Bearer abc\t", "abc", true},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearer    ", "", false},
		{"Bearerabc", "", false},
		{"Bearer\tabc", "", false},
		{"Bearer a b", "", false},
		{"Basic YWJjOmRlZg==", "", false},
		{"Bearxr abc", "", false},
		{"", "", false},
		{"Token abc", "", false},
	}
	for _, tt := range tests {
		tok, ok := auth.BearerToken([]byte(tt.header))
		if ok != tt.ok || string(tok) != tt.want {
			t.Errorf("BearerToken(%q) = %q, %v; want %q, %v", tt.header, tok, ok, tt.want, tt.ok)
		}
	}
}

func TestNewTokenHashLine(t *testing.T) {
	a, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := auth.NewToken()
	if a == b {
		t.Fatal("two NewToken calls returned the same token")
	}
	raw, err := base64.RawURLEncoding.DecodeString(a)
	if err != nil || len(raw) != 32 || len(a) != 43 {
		t.Fatalf("NewToken = %q (%d bytes, %v), want 32 bytes unpadded base64url", a, len(raw), err)
	}
	if got := auth.Hash("token-a"); got != hA {
		t.Fatalf("Hash = %q, want %q", got, hA)
	}
	if got, want := auth.Line("ci", auth.Invoke|auth.Read, hA, []string{"cnn", "vec*"}, auth.Limits{}), "ci\tread,invoke\t"+hA+"\tcnn,vec*"; got != want {
		t.Fatalf("Line = %q, want %q", got, want)
	}
	if got, want := auth.Line("ops", auth.Admin, hB, nil, auth.Limits{}), "ops\tadmin\t"+hB+"\t*"; got != want {
		t.Fatalf("Line = %q, want %q", got, want)
	}
	// A line made by Line parses back to the same principal.
	tab := table(t, auth.Line("ci", auth.Deploy, auth.Hash(a), []string{"v?c", "x*"}, auth.Limits{})+"\n")
	p := tab.Lookup([]byte(a))
	if p == nil || p.Name != "ci" || p.Scopes != auth.Deploy || !reflect.DeepEqual(p.Functions, []string{"v?c", "x*"}) {
		t.Fatalf("Lookup after Line = %+v", p)
	}
}

func TestCheckNameParseFunctions(t *testing.T) {
	for _, ok := range []string{"ci", "a", "ci-bot_1.x@example.com", strings.Repeat("z", 64)} {
		if err := auth.CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("z", 65), "a b", "a#b", "ü", "a,b"} {
		if err := auth.CheckName(bad); err == nil {
			t.Errorf("CheckName(%q) = nil", bad)
		}
	}
	for _, bad := range []string{"", ",", "a,", "#a", "a b", "[", "a\\"} {
		if g, err := auth.ParseFunctions(bad); err == nil {
			t.Errorf("ParseFunctions(%q) = %q", bad, g)
		}
	}
	if g, err := auth.ParseFunctions("cnn,vec*,[a-c]x"); err != nil || !reflect.DeepEqual(g, []string{"cnn", "vec*", "[a-c]x"}) {
		t.Errorf("ParseFunctions = %q, %v", g, err)
	}
}

// A glob that can match no function (a byte no name holds, outside a
// class) grants nothing, and "*" beside other globs is not "every
// function" to what needs every function (gc): both are an operator's
// typo, refused with why, where they were taken and left the token's
// holder with 403s that did not say.
func TestGlobsThatMeanNothingAreRefused(t *testing.T) {
	for _, tc := range []struct{ globs, want string }{
		{"A*", `not "A"`},
		{"team_a-*", `not "_"`},
		{"a.b", `not "."`},
		{"a!", `not "!"`},
		{`x\Y`, `not "Y"`},
		{"*,a", `"*" is every function`},
		{"a*,*", `"*" is every function`},
	} {
		if got, err := auth.ParseFunctions(tc.globs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFunctions(%q) = %q, %v; want an error saying %s", tc.globs, got, err, tc.want)
		}
	}
	for _, g := range []string{"*", "a-*", "v?c", "[A-Z]x", `a\-b`, "[_.]*,b", "0-9*"} {
		if _, err := auth.ParseFunctions(g); err != nil {
			t.Errorf("ParseFunctions(%q): %v", g, err)
		}
	}
}

// Covers is what a did-you-mean may name to a token: the functions its
// globs match, every one for admin or "*", none without a token.
func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		p    *auth.Principal
		fn   string
		want bool
	}{
		{&auth.Principal{Scopes: auth.Invoke, Functions: []string{"a-*", "cnn"}}, "a-vec", true},
		{&auth.Principal{Scopes: auth.Invoke, Functions: []string{"a-*", "cnn"}}, "cnn", true},
		{&auth.Principal{Scopes: auth.Invoke, Functions: []string{"a-*", "cnn"}}, "b-cnn", false},
		{&auth.Principal{Scopes: auth.Read, Functions: []string{"*"}}, "b-cnn", true},
		{&auth.Principal{Scopes: auth.Read}, "b-cnn", true}, // no list: all
		{&auth.Principal{Scopes: auth.Admin, Functions: []string{"a-*"}}, "b-cnn", true},
		{nil, "b-cnn", false},
	} {
		if got := tc.p.Covers(tc.fn); got != tc.want {
			t.Errorf("%+v covers %q: %v, want %v", tc.p, tc.fn, got, tc.want)
		}
	}
}

// A glob written as a shell's negation, "[!a]*" (all but a's functions),
// is a class of '!' and 'a' to path.Match: it granted exactly the
// functions it was written to keep out. No function name holds '!', so
// the glob is refused, naming path.Match's negation, "[^a]*".
func TestShellNegationGlobRefused(t *testing.T) {
	for _, g := range []string{"[!a]*", "team-[!b]*", "x,[!a-c]*"} {
		if got, err := auth.ParseFunctions(g); err == nil || !strings.Contains(err.Error(), `"[^`) {
			t.Errorf("ParseFunctions(%q) = %q, %v; want an error naming [^", g, got, err)
		}
	}
	line := "ci invoke " + auth.Hash("t") + " [!a]*\n"
	if _, err := auth.Parse(strings.NewReader(line), "tokens"); err == nil || !strings.Contains(err.Error(), "tokens:1: FUNCTIONS:") {
		t.Errorf("an auth file granting [!a]*: %v, want tokens:1: FUNCTIONS: refused", err)
	}
	// Negation as path.Match has it, and '!' escaped or not first in a
	// class, are globs like any other.
	for _, g := range []string{"[^a]*", "[a!]*", `[\!a]*`} {
		if _, err := auth.ParseFunctions(g); err != nil {
			t.Errorf("ParseFunctions(%q): %v", g, err)
		}
	}
	p := &auth.Principal{Name: "ci", Scopes: auth.Invoke, Functions: []string{"[^a]*"}}
	if p.Covers("alpha") || !p.Covers("beta") {
		t.Errorf(`[^a]* covers alpha %v, beta %v; want only beta`, p.Covers("alpha"), p.Covers("beta"))
	}
}

// An auth file line holding a token (appended alone, or pasted where its
// hash goes) is refused without quoting it: the refusal is logged at a
// SIGHUP's reload, and the token would leave the host with the logs.
func TestAuthFileErrorsQuoteNoToken(t *testing.T) {
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{
		"ops admin " + auth.Hash("x") + "\n" + tok + "\n",
		"ci invoke " + tok + "\n",
		"ci invoke " + strings.ToUpper(auth.Hash("x")) + "\n",
	} {
		_, err := auth.Parse(strings.NewReader(file), "auth")
		if err == nil || strings.Contains(err.Error(), tok) || strings.Contains(err.Error(), strings.ToUpper(auth.Hash("x"))) {
			t.Errorf("auth file %q: %v, want a refusal quoting no token or hash-column value", file, err)
		}
	}
}
