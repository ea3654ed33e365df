package upstream

import (
	"math"
	"math/rand/v2"
)

// The four balancers of SPEC 13, each one pass or three over the route's targets (a handful),
// without allocation. Candidates are the targets not excluded and, outside panic mode,
// eligible; the caller handles the one-target route.

// pickTwo draws two different candidates at random, weighted, and returns the cheaper: by
// peak-EWMA cost (p2c, ewma.go) when latency is set, else by requests in flight
// (least_request); an exact tie at random, so sequential traffic, all ties, is spread over the
// targets even from one client.
func (s *Set) pickTwo(ts []*Target, now int64, exclude []*Target, all, latency bool) *Target {
	total, n := 0, 0
	var only *Target
	for _, t := range ts {
		if t.candidate(now, exclude, all) {
			total += t.weight
			n++
			only = t
		}
	}
	switch n {
	case 0:
		return nil
	case 1:
		return only
	}
	a := drawWeighted(ts, now, exclude, all, nil, total)
	if a == nil {
		return only // every candidate changed state between the passes
	}
	b := drawWeighted(ts, now, exclude, all, a, total-a.weight)
	if b == nil {
		return a
	}
	var ca, cb float64
	if latency {
		ca, cb = a.cost(now), b.cost(now)
	} else {
		ca, cb = float64(a.st.inflight.Load()), float64(b.st.inflight.Load())
	}
	switch {
	case ca < cb:
		return a
	case cb < ca:
		return b
	case rand.Uint32()&1 == 0:
		return a
	}
	return b
}

// drawWeighted returns a candidate other than skip, each with probability weight/total, where
// total is the sum of the weights of those candidates.
func drawWeighted(ts []*Target, now int64, exclude []*Target, all bool, skip *Target, total int) *Target {
	if total <= 0 {
		return nil
	}
	r := int(rand.Uint64N(uint64(total)))
	var last *Target
	for _, t := range ts {
		if t == skip || !t.candidate(now, exclude, all) {
			continue
		}
		if r < t.weight {
			return t
		}
		r -= t.weight
		last = t
	}
	// Reached only when a target changed state between the passes (an ejection, a check):
	// any remaining candidate does, nil if none is left.
	return last
}

// pickRoundRobin is nginx's smooth weighted round robin: every candidate's current weight grows
// by its weight, the largest is picked and loses the total. Over total consecutive picks each
// target is picked exactly weight times, spread out (5,1,1 gives a a b a c a a, not a×5 b c).
func (s *Set) pickRoundRobin(ts []*Target, now int64, exclude []*Target, all bool) *Target {
	s.rrMu.Lock()
	defer s.rrMu.Unlock()
	total := 0
	var best *Target
	for _, t := range ts {
		if !t.candidate(now, exclude, all) {
			continue
		}
		t.current += t.weight
		total += t.weight
		if best == nil || t.current > best.current {
			best = t
		}
	}
	if best != nil {
		best.current -= total
	}
	return best
}

// pickHash is weighted rendezvous hashing (highest random weight, logarithmic method): each
// candidate scores weight / -ln(u), u in (0,1) a hash of the client IP and the target, and the
// highest score wins. A client's scores do not depend on the other targets, so a target that
// leaves moves only the clients it had, and one that comes back takes back only those.
func (s *Set) pickHash(ts []*Target, now int64, clientIP []byte, exclude []*Target, all bool) *Target {
	if len(clientIP) == 16 && isV4Mapped(clientIP) {
		clientIP = clientIP[12:]
	}
	h := uint64(14695981039346656037)
	for _, c := range clientIP {
		h ^= uint64(c)
		h *= 1099511628211
	}
	var best *Target
	bestScore := math.Inf(-1)
	for _, t := range ts {
		if !t.candidate(now, exclude, all) {
			continue
		}
		x := mix64(h ^ t.seed)
		u := (float64(x>>11) + 0.5) / (1 << 53) // in (0,1): ln never sees 0 or 1
		score := float64(t.weight) / -math.Log(u)
		if score > bestScore {
			best, bestScore = t, score
		}
	}
	return best
}

// isV4Mapped reports whether a 16-byte address is ::ffff:a.b.c.d.
func isV4Mapped(ip []byte) bool {
	for _, c := range ip[:10] {
		if c != 0 {
			return false
		}
	}
	return ip[10] == 0xff && ip[11] == 0xff
}
