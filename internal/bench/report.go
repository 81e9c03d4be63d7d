package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// RequiredKeys are the JSON keys every report carries (null with a reason in
// "skipped" when not measured). Values are ns unless the key says otherwise.
var RequiredKeys = []string{
	"toggle.flip", "toggle.int3", "toggle.int3_async", "toggle.stop",
	"batch20k.flip_per_probe", "invoke.empty", "invoke.runtime",
	"inert_overhead_pct.flip", "inert_overhead_pct.nop",
	"throughput_ratio.10k", "throughput_ratio.100k",
	"peers.uprobe_hit", "peers.xray_hit", "peers.uprobe_attach", "calibrate.wait_ns",
	"provider_cost.cyg_nop", "provider_cost.cyg_flip", "provider_cost.fentry_flip",
	"provider_cost.cyg_glibc", "provider_cost.cyg_runtime_count", "provider_cost.fentry_glibc",
	"provider_cost.fentry_runtime_entry",
	"cli.help", "cli.toggle_list", "cli.toggle_scan", "cli_ratio.toggle_list", "cli_ratio.toggle_scan",
	"region.idle_kib", "region.all20k_kib",
}

// Meta says where and how the report was made.
type Meta struct {
	Date       string             `json:"date"`
	Config     string             `json:"config"`
	Host       string             `json:"host"`
	Kernel     string             `json:"kernel"`
	CPU        string             `json:"cpu"`
	NumCPU     int                `json:"num_cpu"`
	Go         string             `json:"go"`
	GCC        string             `json:"gcc"`
	Clang      string             `json:"clang"`
	TSCHz      float64            `json:"tsc_hz"`
	TSC        TSC                `json:"tsc"`
	LoadBefore string             `json:"loadavg_before"`
	LoadAfter  string             `json:"loadavg_after"`
	Seconds    float64            `json:"seconds"`
	RowSeconds map[string]float64 `json:"row_seconds"`
}

// Section is one part of the markdown report.
type Section struct {
	Title string
	Text  string
	Head  []string
	Rows  [][]string
	Foot  string
}

// Report is everything one run measured.
type Report struct {
	Meta     Meta
	Values   map[string]any     // dotted key -> number or nil
	Stats    map[string]Summary // dotted key -> full summary
	Skipped  map[string]string  // dotted key -> reason
	Micro    []MicroResult
	Provider []ProviderResult
	Sections []Section
	Commands []string
}

func newReport(cfg Config, tsc TSC) *Report {
	host, _ := os.Hostname()
	r := &Report{
		Meta: Meta{Date: time.Now().UTC().Format(time.RFC3339), Config: cfg.Name, Host: host,
			Kernel: strings.TrimSpace(cmdOut("uname", "-srm")), CPU: cpuModel(), NumCPU: runtime.NumCPU(),
			Go: runtime.Version(), GCC: toolVersion("gcc"), Clang: toolVersion("clang"),
			TSCHz: tsc.Hz, TSC: tsc, LoadBefore: Loadavg(), RowSeconds: map[string]float64{}},
		Values: map[string]any{}, Stats: map[string]Summary{}, Skipped: map[string]string{},
	}
	for _, k := range RequiredKeys {
		r.Values[k] = nil
		r.Skipped[k] = "not run (row not selected or failed before this figure)"
	}
	return r
}

// Set records a value (ns unless the key names another unit).
func (r *Report) Set(key string, v float64) {
	r.Values[key] = v
	delete(r.Skipped, key)
}

// SetStat records a summary and its median as the key's value.
func (r *Report) SetStat(key string, s Summary) {
	r.Stats[key] = s
	r.Set(key, s.MedianNs)
}

// Skip records why a figure is missing.
func (r *Report) Skip(key, reason string) {
	if _, ok := r.Values[key]; !ok || r.Values[key] == nil {
		r.Values[key] = nil
	}
	r.Skipped[key] = reason
}

// Add appends a markdown section.
func (r *Report) Add(s Section) { r.Sections = append(r.Sections, s) }

// JSON is results.json: the dotted keys nested, plus stats, skipped, meta.
func (r *Report) JSON() ([]byte, error) {
	root := map[string]any{}
	for k, v := range r.Values {
		nest(root, k, v)
	}
	stats := map[string]any{}
	for k, v := range r.Stats {
		nest(stats, k, v)
	}
	root["stats"] = stats
	root["skipped"] = r.Skipped
	root["meta"] = r.Meta
	root["micro"] = r.Micro
	root["provider"] = r.Provider
	root["build_commands"] = r.Commands
	root["units"] = "ns unless the key names another unit (pct, ratio, per_s; provider_cost.* are percent overheads); stats carry ns and TSC ticks"
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	err := enc.Encode(root)
	return b.Bytes(), err
}

func nest(m map[string]any, key string, v any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[p] = sub
		}
		m = sub
	}
	m[parts[len(parts)-1]] = v
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	m := r.Meta
	fmt.Fprintf(&b, "# edgeprobe benchmark report (%s configuration)\n\n", m.Config)
	fmt.Fprintf(&b, "- date: %s; run took %.0f s\n", m.Date, m.Seconds)
	fmt.Fprintf(&b, "- machine: %s, %s, %d CPUs; %s\n", m.Kernel, m.CPU, m.NumCPU, m.Host)
	fmt.Fprintf(&b, "- TSC: %.1f MHz (%s; invariant: %v)\n", m.TSCHz/1e6, m.TSC.Method, m.TSC.Invariant)
	fmt.Fprintf(&b, "- toolchain: %s; %s; %s\n", m.Go, m.GCC, m.Clang)
	fmt.Fprintf(&b, "- load average before: %s, after: %s\n\n", m.LoadBefore, m.LoadAfter)
	b.WriteString("Every figure is the median over repeated runs, with its p10-p90 spread, in ns and TSC ticks; ratios and overheads are against baselines measured in the same run, interleaved with the variant.\n\n")
	for _, s := range r.Sections {
		fmt.Fprintf(&b, "## %s\n\n", s.Title)
		if s.Text != "" {
			b.WriteString(strings.TrimSpace(s.Text) + "\n\n")
		}
		if len(s.Head) > 0 {
			b.WriteString("| " + strings.Join(s.Head, " | ") + " |\n|")
			for range s.Head {
				b.WriteString("---|")
			}
			b.WriteString("\n")
			for _, row := range s.Rows {
				b.WriteString("| " + strings.Join(row, " | ") + " |\n")
			}
			b.WriteString("\n")
		}
		if s.Foot != "" {
			b.WriteString(strings.TrimSpace(s.Foot) + "\n\n")
		}
	}
	b.WriteString("## Not measured\n\n")
	if len(r.Skipped) == 0 {
		b.WriteString("Nothing: every figure ran.\n\n")
	}
	for _, k := range sortedKeys(r.Skipped) {
		fmt.Fprintf(&b, "- `%s`: %s\n", k, r.Skipped[k])
	}
	b.WriteString("\n## Required keys (results.json)\n\n| key | value |\n|---|---|\n")
	for _, k := range RequiredKeys {
		v := "null"
		if f, ok := r.Values[k].(float64); ok {
			v = fmt.Sprintf("%.4g", f)
		}
		fmt.Fprintf(&b, "| `%s` | %s |\n", k, v)
	}
	return b.String()
}

// Cell formats a summary in ns with spread and ticks.
func Cell(s Summary) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s-%s) / %s ticks", fmtNs(s.MedianNs), fmtNs(s.P10Ns), fmtNs(s.P90Ns), fmtNum(s.MedianTicks))
}

func fmtNs(ns float64) string {
	a := ns
	if a < 0 {
		a = -a
	}
	switch {
	case a >= 1e9:
		return fmt.Sprintf("%.3g s", ns/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.3g ms", ns/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.3g µs", ns/1e3)
	default:
		return fmt.Sprintf("%.3g ns", ns)
	}
}

func fmtNum(v float64) string {
	if v >= 1e4 || v <= -1e4 {
		return fmt.Sprintf("%.3g", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func cmdOut(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.Index(l, ":"); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return runtime.GOARCH
}
