package main

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWritePlotDrawsEverySeries(t *testing.T) {
	idle := results(300, 200)
	saturated := results(300, 200, 200, 200, 503)
	for i := range saturated {
		saturated[i].Timestamp = saturated[i].Timestamp.Add(5 * time.Second)
		saturated[i].Latency *= 10
	}
	series := []Series{{"/api idle", idle}, {"/api saturated <&>", saturated}}
	rows := summarizeAll(series)
	path := filepath.Join(t.TempDir(), "out", "isolation.html")
	if err := WritePlot(path, "isolation", series, rows, []string{"PASS ratio"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	html := string(b)
	for _, want := range []string{"<svg", "<polyline", "/api idle (300 req)", "/api saturated &lt;&amp;&gt; (300 req, 75 failed)", "PASS ratio", "<td>503:75</td>"} {
		if !strings.Contains(html, want) {
			t.Errorf("plot lacks %q", want)
		}
	}
	// Self-contained: no script and nothing fetched.
	for _, banned := range []string{"<script", "src=", "href="} {
		if strings.Contains(html, banned) {
			t.Errorf("plot contains %q", banned)
		}
	}
	// The SVG is well-formed XML.
	svg := html[strings.Index(html, "<svg"):]
	svg = svg[:strings.Index(svg, "</svg>")+len("</svg>")]
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed: %v", err)
		}
	}
	// Two series: two p99 lines and two p50 lines.
	if n := strings.Count(svg, "<polyline"); n != 4 {
		t.Errorf("%d polylines, want 4", n)
	}
}

func TestWritePlotWithoutResults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.html")
	if err := WritePlot(path, "empty", []Series{{"nothing", nil}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("no plot written: %v", err)
	}
}

func TestNiceStep(t *testing.T) {
	for raw, want := range map[float64]float64{0.7: 1, 1.3: 2, 3: 5, 7: 10, 12: 20, 0.03: 0.05} {
		if got := niceStep(raw); got < want*0.999 || got > want*1.001 {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
}

func TestWritePlotBreaksLinesAtGaps(t *testing.T) {
	// One series measured in two rounds 10 s apart: each line is drawn in two pieces.
	first, second := results(100, 200), results(100, 200)
	for i := range second {
		second[i].Timestamp = second[i].Timestamp.Add(10 * time.Second)
	}
	var b strings.Builder
	if err := renderPlot(&b, "rounds", []Series{{"/api idle", append(first, second...)}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "<polyline"); n != 4 {
		t.Errorf("%d polylines, want 4 (p50 and p99, each in two pieces)", n)
	}
}
