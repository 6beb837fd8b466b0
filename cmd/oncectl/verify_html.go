package main

import (
	"fmt"
	"html/template"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// writeHTML writes the report as a page with two pictures: the latency
// histogram of lock acquisitions and claims, and the timeline of every
// hold of every key (a bar per lease, coloured by worker; the killed
// worker's in red).
func (v *verifyRun) writeHTML(path string, r *verifyReport) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	v.mu.Lock()
	hist, timeline := v.histogramSVG(), v.timelineSVG()
	v.mu.Unlock()
	err = verifyPage.Execute(f, map[string]any{"R": r, "Histogram": template.HTML(hist), "Timeline": template.HTML(timeline)})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

var verifyPage = template.Must(template.New("verify").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>oncectl verify {{.R.Store}}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:960px}td{padding:2px 12px}
.ok{color:#1a7f37}.bad{color:#cf222e}svg{border:1px solid #ddd;background:#fff}</style></head><body>
<h1>oncectl verify</h1><p>{{.R.Store}}: {{.R.Duration}}, {{.R.Workers}} workers, {{.R.Keys}} lock keys, TTL {{.R.TTL}}</p>
{{if .R.Pass}}<p class="ok"><b>PASS</b>: no two holders at once, fences only grow, every duplicate got the first answer, the claims' history is linearizable, the killed holder's key freed.</p>
{{else}}{{range .R.Failures}}<p class="bad"><b>FAIL</b>: {{.}}</p>{{end}}{{end}}
<table>
<tr><td>holds / writes accepted / refused by fence</td><td>{{.R.Holds}} / {{.R.WritesOK}} / {{.R.Refused}}</td></tr>
<tr><td>overlapping holds, both writes accepted</td><td>{{.R.Overlaps}}</td></tr>
<tr><td>fences not above an earlier lease's</td><td>{{.R.FenceBack}}</td></tr>
<tr><td>lost updates</td><td>{{.R.LostUpdates}}</td></tr>
<tr><td>claims new / replayed / in flight / failed</td><td>{{.R.New}} / {{.R.Replays}} / {{.R.InFlight}} / {{.R.ClaimErrors}}</td></tr>
<tr><td>replays with another answer</td><td>{{.R.WrongReplays}}</td></tr>
<tr><td>claims' history linearizable</td><td>{{.R.Linearizable}}</td></tr>
{{with .R.Killed}}<tr><td>killed {{.Worker}} holding {{.Key}}: free again after</td><td>{{.Freed}}</td></tr>{{end}}
<tr><td>operations/s</td><td>{{printf "%.0f" .R.OpsPerSec}}</td></tr>
{{range $k, $s := .R.Latency}}<tr><td>{{$k}} p50 / p99 / max</td><td>{{$s.P50}} / {{$s.P99}} / {{$s.Max}} ({{$s.N}})</td></tr>{{end}}
</table>
<h2>Latency</h2><p><span style="color:#0969da">lock acquire</span> (with its wait for the holder),
<span style="color:#1a7f37">new-key claim</span>, <span style="color:#9a6700">replayed claim</span>; log scale.</p>{{.Histogram}}
<h2>Holds</h2><p>Each bar is a lease of a key, from Acquire's return to its release (a lane per key); the killed worker's lease is red.</p>{{.Timeline}}
</body></html>
`))

const vW, vH, vPad = 900, 300, 40

// vlogX maps a latency to 0..1 on a log scale from 100 µs to 10 s.
func vlogX(d time.Duration) float64 {
	lo, hi := math.Log10(1e-4), math.Log10(10)
	x := math.Log10(math.Max(d.Seconds(), 1e-4))
	return (math.Min(x, hi) - lo) / (hi - lo)
}

func (v *verifyRun) histogramSVG() string {
	const buckets = 60
	kinds := []struct{ name, color string }{{"lock", "#0969da"}, {"new", "#1a7f37"}, {"replay", "#9a6700"}}
	counts := make([][buckets]int, len(kinds))
	most := 1
	for i, k := range kinds {
		for _, d := range v.lat[k.name] {
			b := min(int(vlogX(d)*buckets), buckets-1)
			counts[i][b]++
			most = max(most, counts[i][b])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">`, vW, vH)
	bw := float64(vW-2*vPad) / buckets / float64(len(kinds))
	for i, k := range kinds {
		for j, n := range counts[i] {
			h := float64(vH-2*vPad) * float64(n) / float64(most)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %d</title></rect>`,
				vPad+(float64(j)*float64(len(kinds))+float64(i))*bw, float64(vH-vPad)-h, bw, h, k.color, k.name, n)
		}
	}
	for _, t := range []string{"100µs", "1ms", "10ms", "100ms", "1s", "10s"} {
		d, _ := time.ParseDuration(strings.Replace(t, "µ", "u", 1))
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" font-size="11" text-anchor="middle">%s</text>`, vPad+vlogX(d)*float64(vW-2*vPad), vH-vPad+15, t)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func (v *verifyRun) timelineSVG() string {
	var keys []string
	for _, h := range v.holds {
		if !slices.Contains(keys, h.Key) {
			keys = append(keys, h.Key)
		}
	}
	slices.Sort(keys)
	start, end := v.started.UnixNano(), v.ended.UnixNano()
	if end <= start {
		end = start + 1
	}
	lane := float64(vH-2*vPad) / float64(max(1, len(keys)))
	x := func(t int64) float64 {
		return vPad + float64(vW-2*vPad)*math.Max(0, math.Min(1, float64(t-start)/float64(end-start)))
	}
	palette := []string{"#0969da", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a3069", "#116329", "#953800"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">`, vW, vH)
	for i, k := range keys {
		fmt.Fprintf(&b, `<text x="2" y="%.0f" font-size="11">%s</text>`, vPad+lane*(float64(i)+0.5), k)
	}
	for _, h := range v.holds {
		i := slices.Index(keys, h.Key)
		to := h.To
		if to == 0 {
			to = end
		}
		var n int
		_, _ = fmt.Sscanf(h.Worker, "w%d", &n)
		color := palette[n%len(palette)]
		if h.Killed {
			color = "#cf222e"
		}
		fmt.Fprintf(&b, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s"><title>%s fence %d</title></rect>`,
			x(h.From), vPad+lane*float64(i)+2, math.Max(0.5, x(to)-x(h.From)), lane-4, color, h.Worker, h.Fence)
	}
	if k := v.kill; k != nil {
		kx := x(k.At.UnixNano())
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#cf222e" stroke-dasharray="4"/><text x="%.1f" y="%d" font-size="11" fill="#cf222e">kill -9 %s</text>`,
			kx, vPad-5, kx, vH-vPad, kx+3, vPad-8, k.Worker)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">0</text><text x="%d" y="%d" font-size="11" text-anchor="end">%v</text>`,
		vPad, vH-vPad+15, vW-vPad, vH-vPad+15, v.ended.Sub(v.started).Round(time.Millisecond))
	b.WriteString(`</svg>`)
	return b.String()
}
