package named_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/plover-run/plover/named"
)

type picker interface{ Pick() int }

type first struct{}

func (first) Pick() int { return 0 }

type ptrPicker struct{ n int }

func (p *ptrPicker) Pick() int { return p.n }

// Registrations a registry must refuse at init, each a panic: a nil value
// would fail only when first looked up, a second name would shadow the
// first.
func TestRegisterRefuses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		register func()
	}{
		{"twice", func() {
			r := named.New[picker]("policy")
			r.Register("a", first{})
			r.Register("a", first{})
		}},
		{"empty name", func() { named.New[picker]("policy").Register("", first{}) }},
		{"nil interface", func() { named.New[picker]("policy").Register("a", nil) }},
		{"nil func", func() { named.New[func() int]("maker").Register("a", nil) }},
		{"nil pointer", func() { named.New[*first]("thing").Register("a", nil) }},
		// A nil pointer in an interface (var e *evictor; Register("x", e))
		// was taken: it failed only when first used, at run time.
		{"nil pointer in an interface", func() { named.New[picker]("policy").Register("a", (*ptrPicker)(nil)) }},
		{"nil func in an interface", func() { named.New[any]("maker").Register("a", (func())(nil)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.register()
		})
	}
}

// Names come back sorted whatever the registration order, a registered
// name is found, and an unknown one's error lists the choices.
func TestLookupAndNames(t *testing.T) {
	r := named.New[int]("scheduling policy")
	for i, n := range []string{"wfq", "fifo", "lottery"} {
		r.Register(n, i) // a zero int is a value, not nil
	}
	if got, want := r.Names(), []string{"fifo", "lottery", "wfq"}; !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		name    string
		want    int
		wantErr string
	}{
		{"wfq", 0, ""},
		{"lottery", 2, ""},
		{"edf", 0, `scheduling policy "edf": want one of fifo, lottery, wfq`},
		{"", 0, `scheduling policy "": want one of fifo, lottery, wfq`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := r.Lookup(tc.name)
			if tc.wantErr == "" {
				if err != nil || v != tc.want {
					t.Fatalf("Lookup = %v, %v; want %v", v, err, tc.want)
				}
				return
			}
			var unknown *named.UnknownError
			if err == nil || err.Error() != tc.wantErr || !errors.As(err, &unknown) || unknown.Name != tc.name {
				t.Fatalf("Lookup error %v, want %q as *UnknownError", err, tc.wantErr)
			}
			if _, ok := r.Get(tc.name); ok {
				t.Fatal("Get found what Lookup did not")
			}
		})
	}
}
