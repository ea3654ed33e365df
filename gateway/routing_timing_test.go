package gateway

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkRouteMatch matches a mix of requests (paths normalized beforehand) against
// generated tables of 30, 1,000 and 10,000 routes (exact hosts, wildcard hosts, nested
// prefixes, method-restricted routes), and against the hand-written gateway-sized table of
// benchEntries. The cost must not grow with the table (issue 15: at most 300 ns at 10,000
// routes, no allocation). BenchmarkRouteMatchNormalize adds normalizePath, as the header hook
// runs both.
func BenchmarkRouteMatch(b *testing.B) { benchmarkRouteTables(b, false) }

func BenchmarkRouteMatchNormalize(b *testing.B) { benchmarkRouteTables(b, true) }

func benchmarkRouteTables(b *testing.B, normalize bool) {
	b.Run("gateway", func(b *testing.B) {
		benchmarkRouteMatch(b, benchEntries(), benchRequests(), normalize)
	})
	for _, n := range []int{30, 1000, 10000} {
		b.Run(fmt.Sprintf("routes=%d", n), func(b *testing.B) {
			entries, reqs := scaleTable(n)
			benchmarkRouteMatch(b, entries, reqs, normalize)
		})
	}
}

func benchmarkRouteMatch(b *testing.B, entries []tableEntry, reqs []matchCase, normalize bool) {
	table := newRouteTable(entries)
	type req struct{ host, method, path, normalized []byte }
	rs := make([]req, len(reqs))
	for i, c := range reqs {
		rs[i] = req{[]byte(c.host), []byte(c.method), []byte(c.path), normalizePath(nil, []byte(c.path))}
	}
	dst := make([]byte, 0, 256)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := &rs[i%len(rs)]
		path := r.normalized
		if normalize {
			dst = normalizePath(dst[:0], r.path)
			path = dst
		}
		table.match(r.host, r.method, path)
		i++
	}
}

// scaleTable generates a table of n routes shaped like a large multi-tenant gateway, and
// requests against it, some of which match no route. The generator is deterministic.
//
// A tenant k has an exact host t<k>.example.com with nested prefixes, one of them limited to
// POST; every seventh tenant has a wildcard *.t<k>.apps.example.com as well; the rest are
// host-less service prefixes, nested, some method-restricted. The requests hit every kind,
// deep paths included, and fall through from a host to the host-less routes.
func scaleTable(n int) ([]tableEntry, []matchCase) {
	rng := rand.New(rand.NewPCG(uint64(n), 15))
	entries := []tableEntry{
		{Host: "*.example.com", Prefix: "/static/"},
		{Host: "*.apps.example.com", Prefix: "/"},
	}
	var reqs []matchCase
	for k := 0; len(entries) < n; k++ {
		switch k % 3 {
		case 0:
			h := fmt.Sprintf("t%d.example.com", k)
			entries = append(entries,
				tableEntry{Host: h, Prefix: "/api"},
				tableEntry{Host: h, Prefix: fmt.Sprintf("/api/v%d/orders", k%4), Methods: []string{"POST"}},
				tableEntry{Host: h, Prefix: fmt.Sprintf("/api/v%d/orders/export/", k%4)},
			)
			reqs = append(reqs,
				matchCase{host: fmt.Sprintf("T%d.Example.com:8443", k), method: "POST", path: fmt.Sprintf("/api/v%d/orders/%d", k%4, rng.IntN(1000))},
				matchCase{host: h, method: "GET", path: fmt.Sprintf("/api/v%d/orders/export/2024/q%d.csv", k%4, rng.IntN(4))},
				matchCase{host: h, method: "GET", path: fmt.Sprintf("/svc%d/items/%d", rng.IntN(n/3+1), rng.IntN(100))},
			)
			if k%7 == 0 {
				w := fmt.Sprintf("*.t%d.apps.example.com", k)
				entries = append(entries,
					tableEntry{Host: w, Prefix: "/"},
					tableEntry{Host: w, Prefix: "/upload", Methods: []string{"PUT", "POST"}},
				)
				reqs = append(reqs, matchCase{host: fmt.Sprintf("x.y.t%d.apps.example.com", k), method: "PUT", path: "/upload/big.bin"})
			}
		case 1:
			p := fmt.Sprintf("/svc%d", k)
			entries = append(entries,
				tableEntry{Prefix: p},
				tableEntry{Prefix: p + "/items/", Methods: []string{"GET", "HEAD"}},
				tableEntry{Prefix: p + "/items/admin"},
			)
			reqs = append(reqs,
				matchCase{host: "gateway.local", method: "GET", path: p + "/items/./42"},
				matchCase{host: "gateway.local:8080", method: "DELETE", path: p + "/items/42"},
				matchCase{host: "", method: "GET", path: p + "x/nowhere"},
			)
		default:
			p := fmt.Sprintf("/legacy/r%d", k)
			entries = append(entries,
				tableEntry{Prefix: p + "/reports"},
				tableEntry{Prefix: p + "/upload", Methods: []string{"POST"}},
			)
			reqs = append(reqs, matchCase{host: "other.org", method: "GET", path: "/x/.." + p + "/reports/2024/01"})
		}
	}
	entries = entries[:n]
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	if len(reqs) > 512 {
		reqs = reqs[:512]
	}
	return entries, reqs
}
