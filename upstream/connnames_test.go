package upstream

import (
	"fmt"
	"strings"
	"testing"
)

// TestConnNames: the names of every Connection line count, case-insensitively, trimmed, empty
// elements skipped, repeated ones too, in the scanned (short) and the hashed (long) form.
func TestConnNames(t *testing.T) {
	var long []string
	for i := range 300 {
		long = append(long, fmt.Sprintf("X-Long-%d", i))
	}
	cases := []struct {
		name  string
		lines []string
		in    []string
		out   []string
	}{
		{"none", nil, nil, []string{"X-A", "Connection"}},
		{"short", []string{"keep-alive, X-A", " ,x-b\t"}, []string{"Keep-Alive", "x-a", "X-B"}, []string{"X-C", "keep", "X-A-B", ""}},
		{"long one line", []string{strings.Join(long, ", ")}, []string{"x-long-0", "X-LONG-299", "X-Long-150"}, []string{"X-Long-300", "X-Long", "x-long-1x"}},
		{"long with repeats", []string{strings.Repeat("a,", 500), "B , " + strings.Repeat("a,", 500)}, []string{"A", "b"}, []string{"c", "aa"}},
		{"long over several lines", long[:150:150], long[:150], []string{"X-Long-150"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var lines [][]byte
			for _, l := range tc.lines {
				lines = append(lines, []byte(l))
			}
			var stack [128]byte
			names, table := CollectConnNames(stack[:0], lines)
			defer ReleaseConnTable(table)
			for _, k := range tc.in {
				if !names.Has([]byte(k)) {
					t.Errorf("%q not found", k)
				}
			}
			for _, k := range tc.out {
				if names.Has([]byte(k)) {
					t.Errorf("%q found, but the list does not name it", k)
				}
			}
		})
	}
}
