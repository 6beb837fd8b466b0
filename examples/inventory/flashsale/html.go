package flashsale

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"
)

// WriteHTML writes the report as a page with two pictures: the latency
// histogram (log scale) and the timeline of every request (when it started,
// how long it took, how it ended).
func (r *Report) WriteHTML(w io.Writer) error {
	return page.Execute(w, map[string]any{
		"R":         r,
		"Histogram": template.HTML(r.histogramSVG()),
		"Timeline":  template.HTML(r.timelineSVG()),
	})
}

var page = template.Must(template.New("report").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>flash sale {{.R.SKU}}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:960px}td{padding:2px 12px}
.ok{color:#1a7f37}.bad{color:#cf222e}svg{border:1px solid #ddd;background:#fff}</style></head><body>
<h1>Flash sale {{.R.SKU}}</h1>
{{if .R.OK}}<p class="ok"><b>PASS</b>: nothing oversold, no order run twice, every replay identical.</p>
{{else}}{{range .R.Failures}}<p class="bad"><b>FAIL</b>: {{.}}</p>{{end}}{{end}}
<table>
<tr><td>replicas</td><td>{{.R.Replicas}}</td></tr>
<tr><td>buyers / stock</td><td>{{.R.Buyers}} / {{.R.Stock}}</td></tr>
<tr><td>requests</td><td>{{.R.Requests}}</td></tr>
<tr><td>orders confirmed / sold out</td><td>{{.R.Confirmed}} / {{.R.SoldOut}}</td></tr>
<tr><td>replays / retried answers</td><td>{{.R.Replays}} / {{.R.Retried}}</td></tr>
<tr><td>units sold / oversold / duplicate executions</td><td>{{.R.Sold}} / {{.R.Oversold}} / {{.R.DupExec}}</td></tr>
<tr><td>shipments / orders</td><td>{{.R.Shipments}} / {{.R.Orders}}</td></tr>
<tr><td>latency p50 / p99 / max</td><td>{{.R.P50}} / {{.R.P99}} / {{.R.Max}}</td></tr>
<tr><td>orders/s</td><td>{{printf "%.0f" .R.OrdersPerSec}}</td></tr>
</table>
<h2>Latency</h2>{{.Histogram}}
<h2>Timeline</h2><p>Each dot is a request: when it started (x) and how long it took (y, log scale).
<span style="color:#1a7f37">order</span>, <span style="color:#9a6700">sold out</span>,
<span style="color:#0969da">replay</span>, <span style="color:#8c959f">retried</span>,
<span style="color:#cf222e">failed</span>.</p>{{.Timeline}}
</body></html>
`))

const svgW, svgH, pad = 900, 300, 40

// logY maps a latency to a height on a log scale from 100 µs to 10 s.
func logY(d time.Duration) float64 {
	lo, hi := math.Log10(1e-4), math.Log10(10)
	v := math.Log10(math.Max(d.Seconds(), 1e-4))
	return (math.Min(v, hi) - lo) / (hi - lo)
}

func (r *Report) histogramSVG() string {
	const buckets = 40
	var counts [buckets]int
	most := 1
	for _, s := range r.samples {
		b := min(int(logY(s.latency)*buckets), buckets-1)
		counts[b]++
		most = max(most, counts[b])
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">`, svgW, svgH)
	bw := float64(svgW-2*pad) / buckets
	for i, n := range counts {
		h := float64(svgH-2*pad) * float64(n) / float64(most)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#0969da"><title>%d</title></rect>`,
			pad+float64(i)*bw, float64(svgH-pad)-h, bw-1, h, n)
	}
	for _, t := range []string{"100µs", "1ms", "10ms", "100ms", "1s", "10s"} {
		d, _ := time.ParseDuration(strings.Replace(t, "µ", "u", 1))
		x := pad + logY(d)*float64(svgW-2*pad)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" font-size="11" text-anchor="middle">%s</text>`, x, svgH-pad+15, t)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func (r *Report) timelineSVG() string {
	var span time.Duration = 1
	for _, s := range r.samples {
		span = max(span, s.start+s.latency)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">`, svgW, svgH)
	for _, s := range r.samples {
		color := map[outcome]string{created: "#1a7f37", soldOut: "#9a6700", retryable: "#8c959f", failed: "#cf222e"}[s.outcome]
		if s.replayed {
			color = "#0969da"
		}
		x := pad + float64(svgW-2*pad)*s.start.Seconds()/span.Seconds()
		y := float64(svgH-pad) - logY(s.latency)*float64(svgH-2*pad)
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="1.6" fill="%s"/>`, x, y, color)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">0</text><text x="%d" y="%d" font-size="11" text-anchor="end">%v</text>`,
		pad, svgH-pad+15, svgW-pad, svgH-pad+15, span.Round(time.Millisecond))
	for _, t := range []string{"100µs", "10ms", "1s"} {
		d, _ := time.ParseDuration(strings.Replace(t, "µ", "u", 1))
		fmt.Fprintf(&b, `<text x="2" y="%.0f" font-size="11">%s</text>`, float64(svgH-pad)-logY(d)*float64(svgH-2*pad), t)
	}
	b.WriteString(`</svg>`)
	return b.String()
}
