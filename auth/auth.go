// Package auth is Plover's bearer tokens: the auth file, scopes, function globs.
//
// An auth file lists one token per line:
//
//	# NAME   SCOPES        SHA256                                                            FUNCTIONS  LIMITS
//	ci       invoke,read   583a77915a98804db1762f162685c1895dd317db52fdca950f24744635f8a9e4  cnn,vec*   rate=50,burst=100,concurrency=8
//	ops      admin         bb172bff805801f64068ef04c75c687dc840c5f20b5532d780acabac36ac0c7b
//
// LIMITS (optional; FUNCTIONS must then be given, "*" for all) bound what
// one token may ask of the server: rate requests per second with a burst,
// and concurrency requests in flight. Past them the server answers 429
// with Retry-After.
//
// The file holds the SHA-256 of each token, never the token: a server that
// reads it can check a token but not mint one. plover token new makes a
// token and prints its line.
package auth

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scope is a set of permissions.
type Scope uint8

const (
	Read   Scope = 1 << iota // list/show functions, versions, metrics (those Functions cover)
	Invoke                   // POST /v1/functions/NAME/invoke
	Deploy                   // deploy, rollback, delete, gc; implies Read
	Admin                    // everything
)

// scopeNames is in bit order, the order String writes a set in.
var scopeNames = [...]string{"read", "invoke", "deploy", "admin"}

const allScopes = Read | Invoke | Deploy | Admin

// String writes one scope as "read", "invoke", "deploy" or "admin", and a set
// as those names joined with "," in that order ("read,deploy"). The empty set
// is "none"; bits beyond Admin are written in hex ("0x10").
func (s Scope) String() string {
	if s == 0 {
		return "none"
	}
	var b strings.Builder
	for i, n := range scopeNames {
		if s&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(n)
		}
	}
	if rest := s &^ allScopes; rest != 0 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%#x", uint8(rest))
	}
	return b.String()
}

// ParseScopes reads a comma-separated list of scope names ("invoke,read"), in
// any order. An empty list, an empty element or an unknown name is an error.
func ParseScopes(csv string) (Scope, error) {
	if csv == "" {
		return 0, errors.New("no scopes (want a comma-separated list of admin, deploy, invoke, read)")
	}
	var s Scope
	for _, n := range strings.Split(csv, ",") {
		i := scopeIndex(n)
		if i < 0 {
			if n == "" {
				return 0, fmt.Errorf("empty scope in %q", csv)
			}
			return 0, fmt.Errorf("unknown scope %q (want admin, deploy, invoke or read)", n)
		}
		s |= 1 << i
	}
	return s, nil
}

func scopeIndex(name string) int {
	for i, n := range scopeNames {
		if n == name {
			return i
		}
	}
	return -1
}

// Principal is the holder of a token.
type Principal struct {
	Name   string
	Scopes Scope // as written in the file
	// Functions are path.Match globs limiting invoke, deploy and what a
	// read shows (Allow, Covers); Parse sets
	// ["*"] when the file gives none, and Allow treats an empty list as ["*"].
	Functions []string
	// Limits bound the token's requests; the zero value bounds nothing.
	Limits Limits
}

// Limits bound one token's requests: Rate per second with bursts of up to
// Burst (a token bucket), and Concurrency in flight. Zero: no bound.
type Limits struct {
	Rate        float64
	Burst       int
	Concurrency int
}

// Any reports whether l bounds anything.
func (l Limits) Any() bool { return l.Rate > 0 || l.Concurrency > 0 }

// String writes l as the auth file does ("rate=50,burst=100"); "" for none.
func (l Limits) String() string {
	var parts []string
	if l.Rate > 0 {
		parts = append(parts, "rate="+strconv.FormatFloat(l.Rate, 'g', -1, 64), "burst="+strconv.Itoa(l.Burst))
	}
	if l.Concurrency > 0 {
		parts = append(parts, "concurrency="+strconv.Itoa(l.Concurrency))
	}
	return strings.Join(parts, ",")
}

// ParseLimits reads "rate=R[/s],burst=B,concurrency=C", any subset in any
// order; burst defaults to the rate rounded up (at least 1) and needs a rate.
func ParseLimits(csv string) (Limits, error) {
	var l Limits
	seen := map[string]bool{}
	for _, kv := range strings.Split(csv, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return l, fmt.Errorf("%q: want key=value (rate, burst, concurrency)", kv)
		}
		if seen[k] {
			return l, fmt.Errorf("%s given twice", k)
		}
		seen[k] = true
		switch k {
		case "rate":
			r, err := strconv.ParseFloat(strings.TrimSuffix(v, "/s"), 64)
			if err != nil || !(r > 0) || r > 1e9 {
				return l, fmt.Errorf("rate %q: want requests per second, a number above 0", v)
			}
			l.Rate = r
		case "burst", "concurrency":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1<<30 {
				return l, fmt.Errorf("%s %q: want a whole number of at least 1", k, v)
			}
			if k == "burst" {
				l.Burst = n
			} else {
				l.Concurrency = n
			}
		default:
			return l, fmt.Errorf("unknown limit %q (want rate, burst, concurrency)", k)
		}
	}
	if l.Burst > 0 && l.Rate == 0 {
		return l, errors.New("burst needs a rate")
	}
	if l.Rate > 0 && l.Burst == 0 {
		l.Burst = max(1, int(math.Ceil(l.Rate)))
	}
	return l, nil
}

// Denied is a refusal by Principal.Allow: the request is authenticated but
// the token may not do it (HTTP 403).
type Denied struct{ Msg string }

func (d *Denied) Error() string { return d.Msg }

// Allow returns nil, or a *Denied saying what is missing. need is one scope.
//
// Admin allows everything; Deploy implies Read. For need Invoke or Deploy
// with function != "", the function must match one of p.Functions
// (path.Match). With function == "" (a store-wide operation such as gc), need
// Invoke or Deploy requires Admin or a Functions list that is exactly ["*"]
// (or empty). Read is refused by Functions only where function != "" (a
// function's own output, its logs); listings, metadata and metrics are
// not refused but cut to the functions p covers (Covers, CoversAll: the
// transports' gate.View), a name outside them read as no function's.
func (p *Principal) Allow(need Scope, function string) error {
	if p == nil {
		return &Denied{Msg: "no token"}
	}
	if err := p.AllowScope(need); err != nil || p.Scopes&Admin != 0 {
		return err
	}
	if need != Invoke && need != Deploy && function == "" {
		return nil
	}
	if p.allFunctions() {
		return nil
	}
	if function == "" {
		return &Denied{Msg: fmt.Sprintf(`token %q may %s only functions matching %s: store-wide operations need the "admin" scope or functions "*"`,
			p.Name, need.String(), p.globs())}
	}
	if p.Covers(function) {
		return nil
	}
	return &Denied{Msg: fmt.Sprintf("token %q may %s only functions matching %s: not %q", p.Name, need.String(), p.globs(), function)}
}

// AllowScope is Allow's scope alone, its globs not looked at: for a call
// of a function's scope that names no function, which runs nothing (its
// handler refuses it, naming the field) and which Allow would read as a
// store-wide operation.
func (p *Principal) AllowScope(need Scope) error {
	if p == nil {
		return &Denied{Msg: "no token"}
	}
	if bits.OnesCount8(uint8(need)) != 1 || need&^allScopes != 0 {
		return &Denied{Msg: fmt.Sprintf("internal error: Allow needs one scope, got %v", need)}
	}
	have := p.Scopes
	if have&Admin != 0 {
		return nil
	}
	if have&Deploy != 0 {
		have |= Read
	}
	if have&need == 0 {
		return &Denied{Msg: fmt.Sprintf("token %q lacks the %q scope", p.Name, need.String())}
	}
	return nil
}

// Covers reports whether p's globs match function (an admin token's and
// "*" match every one): the names p may use, and so learn of (a
// did-you-mean names no other tenant's function).
func (p *Principal) Covers(function string) bool {
	if p == nil {
		return false
	}
	if p.CoversAll() {
		return true
	}
	for _, g := range p.Functions {
		if ok, _ := path.Match(g, function); ok {
			return true
		}
	}
	return false
}

// CoversAll reports whether p covers every function, those deployed
// later too: an admin token, or functions "*". Such a token reads the
// whole node (every function, its deployers' names, every token's
// series); one that does not reads only what its globs cover.
func (p *Principal) CoversAll() bool {
	return p != nil && (p.Scopes&Admin != 0 || p.allFunctions())
}

func (p *Principal) allFunctions() bool {
	return len(p.Functions) == 0 || len(p.Functions) == 1 && p.Functions[0] == "*"
}

// globs writes p.Functions as `"cnn", "vec*"`.
func (p *Principal) globs() string {
	q := make([]string, len(p.Functions))
	for i, g := range p.Functions {
		q[i] = fmt.Sprintf("%q", g)
	}
	return strings.Join(q, ", ")
}

// CheckName reports whether name is a valid token name: [A-Za-z0-9_.@-]{1,64}.
func CheckName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if len(name) > 64 {
		return fmt.Errorf("name %q is longer than 64 characters", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '@' || c == '-') {
			return fmt.Errorf("name %q has %q: want letters, digits and _ . @ -", name, c)
		}
	}
	return nil
}

// ParseFunctions reads a comma-separated list of path.Match globs ("cnn,vec*").
// Each must be a valid, non-empty pattern without whitespace or '#' (which
// the auth file could not hold).
func ParseFunctions(csv string) ([]string, error) {
	if csv == "" {
		return nil, errors.New("no functions (use * for all)")
	}
	globs := strings.Split(csv, ",")
	for _, g := range globs {
		if g == "" {
			return nil, fmt.Errorf("empty glob in %q", csv)
		}
		if strings.ContainsAny(g, " \t\r\n\v\f#") {
			return nil, fmt.Errorf("glob %q has whitespace or '#'", g)
		}
		if _, err := path.Match(g, ""); err != nil {
			return nil, fmt.Errorf("glob %q: %v", g, err)
		}
		if shellNegation(g) {
			return nil, fmt.Errorf(`glob %q: "[!" is a class holding '!' to path.Match, not a negation (it would grant what it was to keep out): write "[^" to negate`, g)
		}
		if c, ok := foreignLiteral(g); ok {
			return nil, fmt.Errorf("glob %q can match no function: a function's name has only lower-case letters, digits and '-', not %q", g, string(c))
		}
	}
	// Taken as it is, "*,a" would not be "every function" (Covers
	// compares with "*" alone), and what needs every function (gc) would
	// be refused with no word of why.
	if len(globs) > 1 && slices.Contains(globs, "*") {
		return nil, fmt.Errorf(`%q: "*" is every function; give it alone`, csv)
	}
	return globs, nil
}

// foreignLiteral is the first byte glob must match literally (outside a
// class, a '*' or a '?') that no function name holds: such a glob (a
// typo's "A*") grants nothing, and its token's 403s would not say why.
func foreignLiteral(glob string) (byte, bool) {
	for i := 0; i < len(glob); i++ {
		c := glob[i]
		switch c {
		case '*', '?':
			continue
		case '[':
			for i++; i < len(glob) && glob[i] != ']'; i++ { // a class: any of its bytes may be meant
				if glob[i] == '\\' {
					i++
				}
			}
			continue
		case '\\':
			if i++; i == len(glob) {
				return 0, false
			}
			c = glob[i]
		}
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return c, true
		}
	}
	return 0, false
}

// shellNegation reports whether glob has a class opening with an
// unescaped '!' ("[!a]"): a shell's negation, which path.Match reads as
// a class of '!' and the rest, and no function name holds '!'.
func shellNegation(glob string) bool {
	for i := 0; i < len(glob); i++ {
		switch glob[i] {
		case '\\':
			i++ // the escaped byte is a literal
		case '[':
			if i+1 < len(glob) && glob[i+1] == '!' {
				return true
			}
			// Skip the class: its bytes are not openings ("[[!]" is a
			// class of '[' and '!'); ParseFunctions checked its syntax.
			for i++; i < len(glob) && glob[i] != ']'; i++ {
				if glob[i] == '\\' {
					i++
				}
			}
		}
	}
	return false
}

// CheckGrant reports whether functions (ParseFunctions's globs) can limit
// a token of scopes: an admin token acts on every function, so only "*"
// (or none) goes with it.
func CheckGrant(scopes Scope, functions []string) error {
	p := Principal{Scopes: scopes, Functions: functions}
	if scopes&Admin != 0 && !p.allFunctions() {
		return fmt.Errorf("an admin token acts on every function, so %q would not limit it: give * (or no FUNCTIONS), or the scopes it needs instead of admin", strings.Join(functions, ","))
	}
	return nil
}

// checkHash reports whether sha is 64 lowercase hex characters.
func checkHash(sha string) error {
	// The value is never quoted: a token pasted where its hash goes would
	// be written into the server's log (a SIGHUP's reload) in clear.
	if len(sha) != 2*sha256.Size {
		return fmt.Errorf("is %d characters, want 64 hex (the token's hash, never the token)", len(sha))
	}
	for i := 0; i < len(sha); i++ {
		c := sha[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			if 'A' <= c && c <= 'F' {
				return errors.New("has uppercase letters: want lowercase hex")
			}
			return fmt.Errorf("has a character that is not hex at position %d: want lowercase hex (the token's hash, never the token)", i+1)
		}
	}
	if sha == emptyHash {
		return errors.New("the hash of the empty token: no request can send it (hash a token made by plover token new)")
	}
	return nil
}

// emptyHash is the SHA-256 of no bytes: a line with it could match only
// a lookup of an empty token, which no request makes.
const emptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

type entry struct {
	p   Principal
	sum [sha256.Size]byte
}

// Table is a parsed auth file. It is immutable: the *Principal values Lookup
// returns must not be modified.
type Table struct {
	entries []entry
}

// Parse reads an auth file: one token per line, '#' comments (whole line or
// trailing after whitespace) and blank lines allowed; fields separated by
// spaces or tabs: NAME SCOPES SHA256 [FUNCTIONS [LIMITS]].
//
// NAME: [A-Za-z0-9_.@-]{1,64}, unique. SCOPES: comma-separated subset of
// admin,deploy,invoke,read. SHA256: 64 lowercase hex characters, the SHA-256
// of the token's bytes, unique. FUNCTIONS: comma-separated path.Match globs
// (default "*"). LIMITS: see ParseLimits.
//
// A malformed line is an error "SOURCE:LINE: reason" naming the field; so is
// a file with no tokens ("SOURCE: no tokens"), since a server started with
// an empty auth file would refuse everything (a reload takes one: Reload).
func Parse(r io.Reader, source string) (*Table, error) {
	t, err := parse(r, source)
	if err == nil && len(t.entries) == 0 {
		return nil, fmt.Errorf("%s: no tokens", source)
	}
	return t, err
}

// parse is Parse taking a file without tokens.
func parse(r io.Reader, source string) (*Table, error) {
	t := &Table{}
	names := map[string]int{}  // name → line
	hashes := map[string]int{} // sha → line
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	n := 0
	for sc.Scan() {
		n++
		fields := splitLine(sc.Text())
		if len(fields) == 0 {
			continue
		}
		fail := func(format string, a ...any) error {
			return fmt.Errorf("%s:%d: %s", source, n, fmt.Sprintf(format, a...))
		}
		switch len(fields) {
		case 1:
			// Not quoted: a token appended to the file alone
			// (plover token new >> FILE) would be logged in clear.
			return nil, fail("one field alone, %d characters: missing SCOPES and SHA256 (want NAME SCOPES SHA256 [FUNCTIONS]; a token never goes in the file, its hash does)", len(fields[0]))
		case 2:
			return nil, fail("missing SHA256 after SCOPES (want NAME SCOPES SHA256 [FUNCTIONS])")
		case 3, 4, 5:
		default:
			if _, err := ParseScopes(fields[1]); err != nil {
				// Prose, most likely (a note pasted without its #): the
				// count of its words says nothing useful.
				return nil, fail("not a token line: SCOPES %q: %v (want NAME SCOPES SHA256 [FUNCTIONS [LIMITS]]; a comment starts with #)", fields[1], err)
			}
			return nil, fail("extra field %q after LIMITS (FUNCTIONS and LIMITS are each one comma-separated field)", fields[5])
		}
		var e entry
		e.p.Name = fields[0]
		if err := CheckName(e.p.Name); err != nil {
			return nil, fail("NAME: %v", err)
		}
		if prev, ok := names[e.p.Name]; ok {
			return nil, fail("NAME: duplicate name %q (also on line %d)", e.p.Name, prev)
		}
		s, err := ParseScopes(fields[1])
		if err != nil {
			return nil, fail("SCOPES: %v", err)
		}
		e.p.Scopes = s
		sha := fields[2]
		if err := checkHash(sha); err != nil {
			return nil, fail("SHA256: %v", err)
		}
		if prev, ok := hashes[sha]; ok {
			return nil, fail("SHA256: duplicate hash (the same token as line %d)", prev)
		}
		hex.Decode(e.sum[:], []byte(sha))
		e.p.Functions = []string{"*"}
		if len(fields) >= 4 {
			if e.p.Functions, err = ParseFunctions(fields[3]); err != nil {
				return nil, fail("FUNCTIONS: %v", err)
			}
			if err := CheckGrant(e.p.Scopes, e.p.Functions); err != nil {
				return nil, fail("FUNCTIONS: %v", err)
			}
		}
		if len(fields) == 5 {
			if e.p.Limits, err = ParseLimits(fields[4]); err != nil {
				return nil, fail("LIMITS: %v", err)
			}
		}
		names[e.p.Name] = n
		hashes[sha] = n
		t.entries = append(t.entries, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%s:%d: line too long", source, n+1)
		}
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return t, nil
}

// unchanged is t less the tokens a file (which did not parse as a
// whole) does not give exactly as t has them, each of its lines parsed
// alone, and how many it left out: what a reload that failed keeps
// (Reload). A token whose line was deleted, commented out, narrowed or
// broken is dropped, so that no edit a reload refused leaves a token more
// than the operator wrote for it.
func (t *Table) unchanged(b []byte, source string) (*Table, int) {
	lines := map[[sha256.Size]byte][]Principal{}
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		one, err := parse(bytes.NewReader(line), source)
		if err == nil && len(one.entries) == 1 {
			e := one.entries[0]
			lines[e.sum] = append(lines[e.sum], e.p)
		}
	}
	k := &Table{}
	for _, e := range t.entries {
		if slices.ContainsFunc(lines[e.sum], func(p Principal) bool { return reflect.DeepEqual(p, e.p) }) {
			k.entries = append(k.entries, e)
		}
	}
	return k, len(t.entries) - len(k.entries)
}

// splitLine drops a comment ('#' at the start or after whitespace) and splits
// the rest at runs of spaces and tabs.
func splitLine(line string) []string {
	for i := 0; i < len(line); i++ {
		if line[i] == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t') {
			line = line[:i]
			break
		}
	}
	return strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' || r == '\r' })
}

// Lookup hashes token (SHA-256) and compares the hash with every entry in
// constant time, returning the matching principal or nil. It does not
// allocate.
func (t *Table) Lookup(token []byte) *Principal {
	if t == nil {
		return nil
	}
	sum := sha256.Sum256(token)
	match := -1
	for i := range t.entries {
		eq := subtle.ConstantTimeCompare(sum[:], t.entries[i].sum[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return nil
	}
	return &t.entries[match].p
}

// Has reports whether the table holds a token named name.
func (t *Table) Has(name string) bool {
	if t == nil {
		return false
	}
	for i := range t.entries {
		if t.entries[i].p.Name == name {
			return true
		}
	}
	return false
}

// Len is the number of tokens.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
}

// Store is the live table of a server. Load reads the file, Reload re-reads
// it (on SIGHUP), and Lookup reads the current table without locking.
type Store struct {
	path  string
	mu    sync.Mutex // serializes Reload
	table atomic.Pointer[Table]
}

// Load reads the auth file at path.
func Load(path string) (*Store, error) {
	s := &Store{path: path}
	t, err := readFile(path)
	if err != nil {
		return nil, err
	}
	s.table.Store(t)
	return s, nil
}

func readFile(path string) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f, path)
}

// unfinished is how long Reload waits to see a file whose last line has
// no newline again, unchanged, before it takes it; waitUnfinished waits it
// (a variable for tests, which finish the file meanwhile).
const unfinished = 250 * time.Millisecond

var waitUnfinished = func() { time.Sleep(unfinished) }

// Reload re-reads the file. If it cannot be read, is empty or was being
// written, the store keeps the table it had and Reload returns the error.
// If it does not parse, the store keeps only the tokens loaded before
// whose lines the file still has as they were (each line parsed alone),
// and Reload returns the error saying how many it dropped: a revocation
// (a line deleted, commented out or narrowed) holds even when another
// line of the same edit is wrong. A file of comments alone, the same a
// moment later, is taken: no token is valid until the next reload (the
// way to lock a server down). A file
// whose last line has no newline may be a writer still at work (a line
// cut after its hash would give its token every function and no limits),
// or an editor that ends files without one: it is read again a moment
// later, and taken only if it is the same then.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := os.ReadFile(s.path)
	if err != nil {
		return err
	}
	unfinishedChecked := len(b) > 0 && b[len(b)-1] != '\n'
	if unfinishedChecked {
		waitUnfinished()
		again, err := os.ReadFile(s.path)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, again) {
			return fmt.Errorf("%s: it was being written (its last line had no newline, and it changed %v later): the tokens loaded before are kept; write the file under another name and rename it into place", s.path, unfinished)
		}
	}
	if len(bytes.TrimSpace(b)) == 0 {
		// Truncated by a writer not yet done, most likely: a lockdown
		// writes a comment saying so.
		return fmt.Errorf("%s: empty: the tokens loaded before are kept (a file of comments alone refuses every token)", s.path)
	}
	t, err := parse(bytes.NewReader(b), s.path)
	if err != nil {
		kept, dropped := s.table.Load().unchanged(b, s.path)
		if dropped == 0 {
			return fmt.Errorf("%w: the tokens loaded before are kept", err)
		}
		s.table.Store(kept)
		return fmt.Errorf("%w: of the tokens loaded before, %d whose lines the file no longer has as they were were dropped, %d kept", err, dropped, kept.Len())
	}
	if t.Len() == 0 && !unfinishedChecked {
		// A lockdown, or a writer caught after its first comments (a
		// whole line, so not seen above): taken only if the file is the
		// same a moment later.
		waitUnfinished()
		if again, err := os.ReadFile(s.path); err != nil || !bytes.Equal(b, again) {
			return fmt.Errorf("%s: it names no token, and it changed %v later (being written?): the tokens loaded before are kept", s.path, unfinished)
		}
	}
	s.table.Store(t)
	return nil
}

// Lookup finds token in the current table; see Table.Lookup.
func (s *Store) Lookup(token []byte) *Principal { return s.table.Load().Lookup(token) }

// Has reports whether the current table holds a token named name.
func (s *Store) Has(name string) bool { return s.table.Load().Has(name) }

// Len is the number of tokens in the current table.
func (s *Store) Len() int { return s.table.Load().Len() }

// Path is the auth file's path.
func (s *Store) Path() string { return s.path }

// BearerToken extracts TOKEN from an Authorization header value
// "Bearer TOKEN": the scheme is case-insensitive and followed by one space or
// more; trailing spaces and tabs are dropped. ok is false for another scheme,
// an empty token or one with whitespace inside. It does not allocate.
func BearerToken(header []byte) (token []byte, ok bool) {
	const scheme = "bearer"
	if len(header) <= len(scheme) || header[len(scheme)] != ' ' {
		return nil, false
	}
	for i := 0; i < len(scheme); i++ {
		if header[i]|0x20 != scheme[i] {
			return nil, false
		}
	}
	tok := header[len(scheme):]
	for len(tok) > 0 && tok[0] == ' ' {
		tok = tok[1:]
	}
	for len(tok) > 0 && (tok[len(tok)-1] == ' ' || tok[len(tok)-1] == '\t') {
		tok = tok[:len(tok)-1]
	}
	if len(tok) == 0 {
		return nil, false
	}
	for _, c := range tok {
		if c == ' ' || c == '\t' {
			return nil, false
		}
	}
	return tok, true
}

// NewToken returns 32 random bytes (crypto/rand) as unpadded base64url, 43
// characters.
func NewToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Hash is the lowercase hex SHA-256 of token, as the auth file holds it.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Line formats an auth-file line: "NAME\tSCOPES\tSHA256\tFUNCTIONS[\tLIMITS]",
// with FUNCTIONS "*" when functions is empty.
func Line(name string, scopes Scope, sha string, functions []string, limits Limits) string {
	f := "*"
	if len(functions) > 0 {
		f = strings.Join(functions, ",")
	}
	line := name + "\t" + scopes.String() + "\t" + sha + "\t" + f
	if limits.Any() {
		line += "\t" + limits.String()
	}
	return line
}
