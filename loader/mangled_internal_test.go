package loader

import "testing"

// mangledName reads the unqualified name of the mangled forms a hook can
// take, and nothing of a symbol a tenant wrote to mislead it.
func TestMangledName(t *testing.T) {
	for _, tt := range []struct{ sym, want string }{
		{"_Z11plover_loadP12plover_state", "plover_load"},
		{"_Z11plover_loadPv", "plover_load"},
		{"_ZN2ns11plover_loadEP12plover_state", "plover_load"},
		{"_ZN2ns5inner13plover_unloadEv", "plover_unload"},
		{"_ZNK3Foo11plover_loadEv", "plover_load"}, // a const member
		{"_ZN11plover_sim_5beginERNS_5StateE", "begin"},
		{"_ZN11plover_sim_8LauncherIPFvvEEclEv", ""}, // a template's member
		{"_ZZ4mainE1x", ""},                          // a local entity
		{"_ZSt4moveIiEOT_S1_", ""},                   // std::
		{"plover_load", ""},
		{"_Z", ""},
		{"_Z0x", ""},
		{"_Z5ab", ""},                   // a length past the symbol's end
		{"_Z99999999999999999999x", ""}, // a length past any int
		{"_ZN2ns11plover_load", ""},     // no end of the nested name
	} {
		if got := mangledName(tt.sym); got != tt.want {
			t.Errorf("mangledName(%q) = %q, want %q", tt.sym, got, tt.want)
		}
	}
}
