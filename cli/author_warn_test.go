package cli

import (
	"strings"
	"testing"
)

// The warnings plover build counts, from the lines each compiler writes:
// g++'s each time, and nvcc's, which its passes repeat, once a distinct
// line. nvcc's own ("nvcc warning : ") and ptxas's ("ptxas warning : ",
// once per cuda_arch) went uncounted.
func TestWarningCounter(t *testing.T) {
	const (
		gxx      = "loop.cu:16:39: warning: comparison of unsigned expression in '>= 0' is always true [-Wtype-limits]"
		gxxOther = "loop.cu:20:7: warning: unused variable 'unused' [-Wunused-variable]"
		front    = "loop.cu(16): warning #186-D: pointless comparison of unsigned integer with zero"
		nvcc     = "nvcc warning : The 'compute_35', 'compute_37', 'sm_35', and 'sm_37' architectures are deprecated, and may be removed in a future release (Use -Wno-deprecated-gpu-targets to suppress warning)."
		ptxas    = "ptxas warning : Local memory used for function '_Z1kPf', size of stack frame: 16400 bytes"
	)
	for _, tt := range []struct {
		name  string
		lines []string
		end   string // after the last line
		want  int
	}{
		{"g++: every line, a macro's at each expansion", []string{gxx, "  16 |   for (unsigned s = n; s >= 0; s--)", gxx, gxxOther}, "\n", 3},
		{"nvcc's front end: once a line", []string{front, front}, "\n", 1},
		{"nvcc's own", []string{nvcc}, "\n", 1},
		{"ptxas: once, not once per cuda_arch", []string{ptxas, ptxas}, "\n", 1},
		{"all of them", []string{nvcc, front, gxx, front, ptxas, ptxas}, "\n", 4},
		{"the word in prose is none", []string{"cc1plus: all warnings being treated as errors", "host build of .: 2 compiler warnings above; read them"}, "\n", 0},
		{"a last line without its newline", []string{"x.cu(1): warning #177-D: variable \"y\" was declared but never referenced"}, "", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			text := strings.Join(tt.lines, "\n") + tt.end
			w := &warningCounter{}
			for len(text) > 0 { // in pieces, as a pipe delivers it
				n := min(7, len(text))
				w.Write([]byte(text[:n]))
				text = text[n:]
			}
			if got := w.count(); got != tt.want {
				t.Fatalf("%d warnings counted, want %d, in:\n%s", got, tt.want, strings.Join(tt.lines, "\n"))
			}
		})
	}
}
