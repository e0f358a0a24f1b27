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

// stdSymbol takes the standard library's unique symbols (g++ makes them
// in every library that uses its headers) and no user code's.
func TestStdSymbol(t *testing.T) {
	for _, tt := range []struct {
		sym string
		std bool
	}{
		{"_ZZNSt19_Sp_make_shared_tag5_S_tiEvE5__tag", true}, // make_shared's tag, a local static
		{"_ZGVZNSt8__detail9_ScannerIcE12_M_eat_escapeEvE6__sent", true},
		{"_ZNSt7__cxx1112regex_traitsIcE10_RegexMaskE", true},
		{"_ZNKSt5ctypeIcE8do_widenEc", true}, // a const member
		{"_ZNSs4_Rep20_S_empty_rep_storageE", true},
		{"_ZN9__gnu_cxx5__ops8_Iter_lessE", true},
		{"_ZSt4cout", true},
		{"_ZTVSt9exception", true},
		{"_ZZ5modelvE1m", false}, // a user's inline function's static
		{"_ZN5Model8instanceE", false},
		{"_ZZN2ns5cacheEvE1c", false},
		{"_ZN3StdE", false}, // a user's namespace Std, not std
		{"plover_load", false},
	} {
		if got := stdSymbol(tt.sym); got != tt.std {
			t.Errorf("stdSymbol(%q) = %v, want %v", tt.sym, got, tt.std)
		}
	}
}
