package tracing

import (
	"bytes"
	"testing"
)

const (
	sampleTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	sampleParent = "00f067aa0ba902b7"
)

func TestParseParent(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		ok      bool
		sampled bool
	}{
		{"sampled", "00-" + sampleTrace + "-" + sampleParent + "-01", true, true},
		{"not sampled", "00-" + sampleTrace + "-" + sampleParent + "-00", true, false},
		{"other flags kept", "00-" + sampleTrace + "-" + sampleParent + "-09", true, true},
		{"higher version, longer", "01-" + sampleTrace + "-" + sampleParent + "-01-extra", true, true},
		{"higher version, exact", "cc-" + sampleTrace + "-" + sampleParent + "-00", true, false},
		{"version 00 with more", "00-" + sampleTrace + "-" + sampleParent + "-01-extra", false, false},
		{"higher version, no dash after flags", "01-" + sampleTrace + "-" + sampleParent + "-01x", false, false},
		{"version ff", "ff-" + sampleTrace + "-" + sampleParent + "-01", false, false},
		{"upper-case trace id", "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + sampleParent + "-01", false, false},
		{"upper-case version", "0A-" + sampleTrace + "-" + sampleParent + "-01", false, false},
		{"zero trace id", "00-00000000000000000000000000000000-" + sampleParent + "-01", false, false},
		{"zero parent id", "00-" + sampleTrace + "-0000000000000000-01", false, false},
		{"short", "00-" + sampleTrace + "-" + sampleParent + "-1", false, false},
		{"empty", "", false, false},
		{"bad separator", "00_" + sampleTrace + "-" + sampleParent + "-01", false, false},
		{"bad flags", "00-" + sampleTrace + "-" + sampleParent + "-0g", false, false},
		{"space", " 00-" + sampleTrace + "-" + sampleParent + "-01", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, ok := ParseParent([]byte(c.in))
			if ok != c.ok {
				t.Fatalf("ParseParent(%q) ok = %v, want %v", c.in, ok, c.ok)
			}
			if !ok {
				return
			}
			if p.Sampled() != c.sampled {
				t.Errorf("sampled = %v, want %v", p.Sampled(), c.sampled)
			}
			if got := string(AppendHex(nil, p.TraceID[:])); got != sampleTrace {
				t.Errorf("trace id %s, want %s", got, sampleTrace)
			}
			if got := string(AppendHex(nil, p.SpanID[:])); got != sampleParent {
				t.Errorf("parent id %s, want %s", got, sampleParent)
			}
		})
	}
}

func TestAppendTraceparent(t *testing.T) {
	p, ok := ParseParent([]byte("00-" + sampleTrace + "-" + sampleParent + "-01"))
	if !ok {
		t.Fatal("sample traceparent refused")
	}
	if got, want := string(AppendTraceparent([]byte("x:"), p.TraceID, p.SpanID, true)), "x:00-"+sampleTrace+"-"+sampleParent+"-01"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := string(AppendTraceparent(nil, p.TraceID, p.SpanID, false)); got[len(got)-3:] != "-00" {
		t.Errorf("unsampled flags in %q", got)
	}
}

func TestValidTracestate(t *testing.T) {
	for in, want := range map[string]bool{
		"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7": true,
		"":                                     true,
		"a=b\r\nx: y":                          false,
		string(bytes.Repeat([]byte("a"), 513)): false,
	} {
		if got := ValidTracestate([]byte(in)); got != want {
			t.Errorf("ValidTracestate(%.20q) = %v, want %v", in, got, want)
		}
	}
}

func TestNewIDsValid(t *testing.T) {
	seen := make(map[TraceID]bool)
	for range 1000 {
		id := newTraceID()
		if id == (TraceID{}) || seen[id] {
			t.Fatalf("trace id %x zero or repeated", id)
		}
		seen[id] = true
		if newSpanID() == (SpanID{}) {
			t.Fatal("zero span id")
		}
	}
}

// TestParseParentAllocs: the header of every request is parsed; it must not allocate.
func TestParseParentAllocs(t *testing.T) {
	in := []byte("00-" + sampleTrace + "-" + sampleParent + "-01")
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() {
		p, _ := ParseParent(in)
		buf = AppendTraceparent(buf[:0], p.TraceID, p.SpanID, p.Sampled())
	}); n != 0 {
		t.Errorf("ParseParent + AppendTraceparent: %v allocs, want 0", n)
	}
}

// FuzzParseParent: whatever the input, ParseParent does not panic, and what it accepts writes
// back as the same trace and parent ids.
func FuzzParseParent(f *testing.F) {
	f.Add("00-" + sampleTrace + "-" + sampleParent + "-01")
	f.Add("01-" + sampleTrace + "-" + sampleParent + "-01-x")
	f.Add("ff-" + sampleTrace + "-" + sampleParent + "-01")
	f.Add("00-00000000000000000000000000000000-" + sampleParent + "-01")
	f.Fuzz(func(t *testing.T, in string) {
		p, ok := ParseParent([]byte(in))
		if !ok {
			return
		}
		out := string(AppendTraceparent(nil, p.TraceID, p.SpanID, p.Sampled()))
		if out[3:52] != in[3:52] {
			t.Fatalf("%q wrote back as %q", in, out)
		}
	})
}

func BenchmarkParseParent(b *testing.B) {
	in := []byte("00-" + sampleTrace + "-" + sampleParent + "-01")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ParseParent(in); !ok {
			b.Fatal("refused")
		}
	}
}
