package main

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The plot is one self-contained HTML file: an SVG drawn here (no script, no network) of
// latency over time, one colour per series, and the summary table under it. Time is cut into
// plotBuckets windows; each window draws the series' p50 (thin) and max (dots) and p99 (thick
// line), on a logarithmic latency axis so a 0.3 ms API and a 15 s report fit on one picture.
// Failed requests are ticks under the time axis.

const (
	plotWidth   = 1000
	plotHeight  = 460
	plotLeft    = 70
	plotRight   = 20
	plotTop     = 20
	plotBottom  = 60
	plotBuckets = 120
	// plotMaxGapBuckets is the most empty time windows a line bridges.
	plotMaxGapBuckets = 3
)

var plotColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

// Series is one named list of results to plot.
type Series struct {
	Name    string
	Results []vegeta.Result
}

// WritePlot writes the HTML plot of series and their summary rows to path.
func WritePlot(path, title string, series []Series, rows []Summary, notes []string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("loadtest: cannot create the plot folder: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("loadtest: cannot write the plot: %w", err)
	}
	if err := renderPlot(f, title, series, rows, notes); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

type plotLine struct {
	Color, Name       string
	P50, P99          []string // polylines, one per run of nearby time windows
	Max               []plotPoint
	Errors            []plotPoint
	ErrorCount, Count int
}

type plotPoint struct{ X, Y float64 }

type plotTick struct {
	Pos   float64
	Label string
}

type plotPage struct {
	Title                     string
	Generated                 string
	Width, Height             int
	Left, Top, Right, Bottom  float64
	XTicks, YTicks            []plotTick
	Lines                     []plotLine
	Rows                      []Summary
	Notes                     []string
	LegendY                   float64
	XLabelY, YLabelX, YLabelY float64
}

func renderPlot(w io.Writer, title string, series []Series, rows []Summary, notes []string) error {
	p := plotPage{
		Title: title, Generated: time.Now().Format(time.RFC3339),
		Width: plotWidth, Height: plotHeight + 20*((len(series)+1)/2),
		Left: plotLeft, Top: plotTop, Right: plotWidth - plotRight, Bottom: plotHeight - plotBottom,
		Rows: rows, Notes: notes,
	}
	p.XLabelY = p.Bottom + 40
	p.YLabelX, p.YLabelY = 16, (p.Top+p.Bottom)/2
	p.LegendY = plotHeight - 4

	// Axes ranges over every result.
	var t0, t1 time.Time
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for i := range s.Results {
			r := &s.Results[i]
			if t0.IsZero() || r.Timestamp.Before(t0) {
				t0 = r.Timestamp
			}
			if e := r.End(); e.After(t1) {
				t1 = e
			}
			ms := latencyMs(r.Latency)
			lo, hi = math.Min(lo, ms), math.Max(hi, ms)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.1, 1
		t1 = t0.Add(time.Second)
	}
	span := t1.Sub(t0).Seconds()
	if span <= 0 {
		span = 1
	}
	decLo, decHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if decHi <= decLo {
		decHi = decLo + 1
	}
	xOf := func(sec float64) float64 { return p.Left + (p.Right-p.Left)*sec/span }
	yOf := func(ms float64) float64 {
		f := (math.Log10(latencyClamp(ms)) - decLo) / (decHi - decLo)
		return p.Bottom - (p.Bottom-p.Top)*math.Max(0, math.Min(1, f))
	}
	for d := decLo; d <= decHi; d++ {
		p.YTicks = append(p.YTicks, plotTick{Pos: yOf(math.Pow(10, d)), Label: msLabel(math.Pow(10, d))})
	}
	step := niceStep(span / 8)
	for s := 0.0; s <= span+1e-9; s += step {
		p.XTicks = append(p.XTicks, plotTick{Pos: xOf(s), Label: trimFloat(s) + "s"})
	}

	bucket := span / plotBuckets
	for i, s := range series {
		line := plotLine{Color: plotColors[i%len(plotColors)], Name: s.Name, Count: len(s.Results)}
		groups := make([][]float64, plotBuckets+1)
		for j := range s.Results {
			r := &s.Results[j]
			b := int(r.Timestamp.Sub(t0).Seconds() / bucket)
			b = max(0, min(b, plotBuckets))
			groups[b] = append(groups[b], latencyMs(r.Latency))
			if errorClass(r) != "" {
				line.ErrorCount++
				line.Errors = append(line.Errors, plotPoint{X: xOf(r.Timestamp.Sub(t0).Seconds()), Y: p.Bottom + 2 + float64(i%4)*2.5})
			}
		}
		// A series measured in phases (isolation rounds) has gaps: a line does not cross them.
		var p50, p99 []string
		prev := -1
		flush := func() {
			if len(p50) > 0 {
				line.P50 = append(line.P50, strings.Join(p50, " "))
				line.P99 = append(line.P99, strings.Join(p99, " "))
			}
			p50, p99 = nil, nil
		}
		for b, g := range groups {
			if len(g) == 0 {
				continue
			}
			if prev >= 0 && b-prev > plotMaxGapBuckets {
				flush()
			}
			prev = b
			slices.Sort(g)
			x := xOf((float64(b) + 0.5) * bucket)
			p50 = append(p50, fmt.Sprintf("%.1f,%.1f", x, yOf(floatQuantile(g, 0.5))))
			p99 = append(p99, fmt.Sprintf("%.1f,%.1f", x, yOf(floatQuantile(g, 0.99))))
			line.Max = append(line.Max, plotPoint{X: x, Y: yOf(g[len(g)-1])})
		}
		flush()
		if len(line.Errors) > 2000 {
			line.Errors = thin(line.Errors, 2000)
		}
		p.Lines = append(p.Lines, line)
	}
	return plotTemplate.Execute(w, p)
}

// thin keeps n evenly spaced points.
func thin(ps []plotPoint, n int) []plotPoint {
	out := make([]plotPoint, 0, n)
	for i := range n {
		out = append(out, ps[i*len(ps)/n])
	}
	return out
}

func latencyMs(d time.Duration) float64 { return latencyClamp(float64(d) / float64(time.Millisecond)) }

// latencyClamp keeps a latency on the log axis: nothing is drawn below 1 µs.
func latencyClamp(ms float64) float64 { return math.Max(ms, 0.001) }

func floatQuantile(sorted []float64, q float64) float64 {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func msLabel(ms float64) string {
	switch {
	case ms >= 1000:
		return trimFloat(ms/1000) + "s"
	case ms >= 1:
		return trimFloat(ms) + "ms"
	}
	return trimFloat(ms*1000) + "µs"
}

func trimFloat(f float64) string {
	s := fmt.Sprintf("%.3f", f)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// niceStep rounds a raw tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

var plotTemplate = template.Must(template.New("plot").Funcs(template.FuncMap{
	"dur":  fmtDuration,
	"sub":  func(a, b float64) float64 { return a - b },
	"add":  func(a, b float64) float64 { return a + b },
	"legx": func(i int) float64 { return plotLeft + float64(i%2)*460 },
	"legy": func(base float64, i int) float64 { return base + float64(i/2)*20 },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin-top:16px;font-size:14px}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child,td:last-child,th:last-child{text-align:left}
svg text{font-size:12px;fill:#333}
</style></head><body>
<h1>{{.Title}}</h1>
<p>Latency over time, logarithmic axis: thick line p99, thin line p50, dots the maximum of each time window; ticks under the time axis are failed requests. Generated {{.Generated}}.</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}">
<rect x="{{.Left}}" y="{{.Top}}" width="{{sub .Right .Left}}" height="{{sub .Bottom .Top}}" fill="#fafafa" stroke="#999"/>
{{- range .YTicks}}
<line x1="{{$.Left}}" x2="{{$.Right}}" y1="{{.Pos}}" y2="{{.Pos}}" stroke="#ddd"/><text x="{{sub $.Left 6}}" y="{{add .Pos 4}}" text-anchor="end">{{.Label}}</text>
{{- end}}
{{- range .XTicks}}
<line x1="{{.Pos}}" x2="{{.Pos}}" y1="{{$.Top}}" y2="{{$.Bottom}}" stroke="#eee"/><text x="{{.Pos}}" y="{{add $.Bottom 24}}" text-anchor="middle">{{.Label}}</text>
{{- end}}
<text x="{{.Left}}" y="{{.XLabelY}}">time since the first request</text>
<text x="{{.YLabelX}}" y="{{.YLabelY}}" transform="rotate(-90 {{.YLabelX}} {{.YLabelY}})" text-anchor="middle">latency</text>
{{- range $i, $l := .Lines}}
<g>
{{- range $l.P50}}<polyline points="{{.}}" fill="none" stroke="{{$l.Color}}" stroke-width="1" stroke-opacity="0.7"/>{{end}}
{{- range $l.P99}}<polyline points="{{.}}" fill="none" stroke="{{$l.Color}}" stroke-width="2.5"/>{{end}}
{{- range $l.Max}}<circle cx="{{.X}}" cy="{{.Y}}" r="1.8" fill="{{$l.Color}}"/>{{end}}
{{- range $l.Errors}}<line x1="{{.X}}" x2="{{.X}}" y1="{{.Y}}" y2="{{add .Y 3}}" stroke="{{$l.Color}}"/>{{end}}
<rect x="{{legx $i}}" y="{{sub (legy $.LegendY $i) 10}}" width="14" height="10" fill="{{$l.Color}}"/>
<text x="{{add (legx $i) 20}}" y="{{legy $.LegendY $i}}">{{$l.Name}} ({{$l.Count}} req{{if $l.ErrorCount}}, {{$l.ErrorCount}} failed{{end}})</text>
</g>
{{- end}}
</svg>
<table>
<tr><th>series</th><th>requests</th><th>req/s</th><th>ok %</th><th>p50</th><th>p90</th><th>p99</th><th>max</th><th>errors by status</th></tr>
{{- range .Rows}}
<tr><td>{{.Name}}</td><td>{{.Requests}}</td><td>{{printf "%.1f" .Rate}}</td><td>{{printf "%.2f" .OKShare}}</td><td>{{dur .P50}}</td><td>{{dur .P90}}</td><td>{{dur .P99}}</td><td>{{dur .Max}}</td><td>{{.ErrorsText}}</td></tr>
{{- end}}
</table>
{{- range .Notes}}
<p>{{.}}</p>
{{- end}}
</body></html>
`))
