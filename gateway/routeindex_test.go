package gateway

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// refMatch is the reference matcher of the randomized test: SPEC 2's rules read literally,
// route by route, with nothing shared with routeTable but the entry type. Among the routes
// whose host, prefix and method match, the least key (host class, longer wildcard, longer
// prefix, methods listed) wins, the earlier route on a tie.
func refMatch(entries []tableEntry, host, method, path string) int {
	h := strings.ToLower(refHostName(host))
	best, bestKey := -1, [4]int{}
	for i, e := range entries {
		class, wildcardLen := 2, 0
		if e.Host != "" {
			eh := strings.ToLower(e.Host)
			if suffix, ok := strings.CutPrefix(eh, "*"); ok && len(eh) > 2 && suffix[0] == '.' {
				suffix = strings.TrimSuffix(suffix, ".")
				if len(h) <= len(suffix) || !strings.HasSuffix(h, suffix) {
					continue
				}
				class, wildcardLen = 1, len(suffix)
			} else {
				if refHostName(eh) != h {
					continue
				}
				class = 0
			}
		}
		if !refPrefixMatch(path, e.Prefix) {
			continue
		}
		allMethods := 1
		if len(e.Methods) > 0 {
			if !slices.Contains(e.Methods, method) {
				continue
			}
			allMethods = 0
		}
		key := [4]int{class, -wildcardLen, -len(e.Prefix), allMethods}
		if best < 0 || slices.Compare(key[:], bestKey[:]) < 0 {
			best, bestKey = i, key
		}
	}
	return best
}

// refHostName is the host name of a Host value: `[v6]` without its brackets (and whatever
// followed), else without a `:port` when there is exactly one colon, and without one trailing
// dot.
func refHostName(h string) string {
	if strings.HasPrefix(h, "[") {
		if end := strings.Index(h, "]"); end > 0 {
			return h[1:end]
		}
		return h
	}
	if strings.Count(h, ":") == 1 {
		h, _, _ = strings.Cut(h, ":")
	}
	if len(h) > 1 && strings.HasSuffix(h, ".") {
		h = h[:len(h)-1]
	}
	return h
}

// refPrefixMatch: path starts with prefix and the next byte of path, if any, begins a
// segment (or prefix ended one).
func refPrefixMatch(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	rest := path[len(prefix):]
	return prefix == "" || rest == "" || strings.HasSuffix(prefix, "/") || strings.HasPrefix(rest, "/")
}

// TestRouteIndexMatchesReference compares the index with refMatch over many generated tables
// and requests: hosts of every class from a small vocabulary (so that they collide), upper
// case, ports, trailing dots, IPv6 literals, hosts longer than the index's stack buffer;
// nested prefixes with and without trailing slashes; method lists, empty ones included.
func TestRouteIndexMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 2026))
	long := strings.Repeat("l.", 140) + "a.com" // 285 bytes: beyond maxIndexedHost
	labels := []string{"a", "b", "x", "com", "A", "B"}
	genHost := func() string {
		n := 1 + rng.IntN(4)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = labels[rng.IntN(len(labels))]
		}
		return strings.Join(parts, ".")
	}
	segs := []string{"a", "b", "ab", "a.b", "", "%2F"}
	genPath := func(maxSegs int) string {
		var sb strings.Builder
		n := rng.IntN(maxSegs + 1)
		for range n {
			sb.WriteByte('/')
			sb.WriteString(segs[rng.IntN(len(segs))])
		}
		if n == 0 || rng.IntN(4) == 0 {
			sb.WriteByte('/')
		}
		return sb.String()
	}
	methods := []string{"GET", "POST", "HEAD"}
	genEntryHost := func() string {
		switch rng.IntN(12) {
		case 0, 1, 2, 3:
			return ""
		case 4, 5, 6:
			return genHost()
		case 7, 8, 9:
			return "*." + genHost()
		case 10:
			return []string{"[::1]", "::1", "localhost", "A.com.", "*.a.com.", "*.", "*.."}[rng.IntN(7)]
		default:
			return []string{long, "*." + long, "*.a." + long, "X." + long}[rng.IntN(4)]
		}
	}
	genReqHost := func() string {
		h := genHost()
		switch rng.IntN(10) {
		case 0:
			h += ":8080"
		case 1:
			h += "."
		case 2:
			h = []string{"", "[::1]:80", "[::1]", "::1", "[::1", "LOCALHOST:1", "a.com.:80", ".a.com", "..", "."}[rng.IntN(10)]
		case 3:
			h = []string{long, "y." + long, "Y.X." + strings.ToUpper(long) + ":443", "a." + long}[rng.IntN(4)]
		}
		return h
	}
	for table := 0; table < 3000; table++ {
		entries := make([]tableEntry, 1+rng.IntN(12))
		for i := range entries {
			e := tableEntry{Host: genEntryHost(), Prefix: genPath(3)}
			switch rng.IntN(4) {
			case 0:
				e.Methods = []string{}
			case 1:
				e.Methods = []string{methods[rng.IntN(3)]}
			case 2:
				e.Methods = []string{methods[rng.IntN(3)], methods[rng.IntN(3)]}
			}
			entries[i] = e
		}
		// Some routes copy another's host or prefix, so that groups and tree nodes are shared.
		for range rng.IntN(4) {
			a, b := rng.IntN(len(entries)), rng.IntN(len(entries))
			if rng.IntN(2) == 0 {
				entries[a].Host = entries[b].Host
			} else {
				entries[a].Prefix = entries[b].Prefix
			}
		}
		idx := newRouteTable(entries)
		for range 100 {
			host, method, path := genReqHost(), methods[rng.IntN(3)], genPath(5)
			got := idx.match([]byte(host), []byte(method), []byte(path))
			if want := refMatch(entries, host, method, path); got != want {
				t.Fatalf("table %d %+v\nmatch(%q, %q, %q) = %d, reference %d", table, entries, host, method, path, got, want)
			}
		}
	}
}

// TestRouteIndexZeroAllocsLarge: a lookup in a table of 10,000 routes allocates nothing,
// whatever group answers (exact, wildcard, host-less, none) and for a host longer than the
// index's stack buffer.
func TestRouteIndexZeroAllocsLarge(t *testing.T) {
	entries, reqs := scaleTable(10000)
	long := strings.Repeat("L.", 200) + "Example.com"
	reqs = append(reqs, matchCase{host: long, method: "GET", path: "/static/app.js"})
	table := newRouteTable(entries)
	type req struct{ host, method, path []byte }
	rs := make([]req, len(reqs))
	matched := 0
	for i, c := range reqs {
		rs[i] = req{[]byte(c.host), []byte(c.method), normalizePath(nil, []byte(c.path))}
		if table.match(rs[i].host, rs[i].method, rs[i].path) >= 0 {
			matched++
		}
	}
	if matched == 0 || matched == len(rs) {
		t.Fatalf("%d of %d requests match: the test requests must both hit and miss", matched, len(rs))
	}
	i := 0
	if n := testing.AllocsPerRun(5000, func() {
		r := &rs[i%len(rs)]
		table.match(r.host, r.method, r.path)
		i++
	}); n != 0 {
		t.Errorf("match allocates %v times per run, want 0", n)
	}
}
