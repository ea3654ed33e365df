package limits

import "sync/atomic"

// Bulkhead is an atomic in-flight counter with a ceiling. The check and the increment are one
// compare-and-swap, so a burst never overshoots the ceiling. A ceiling of 0 means unlimited: the
// counter still counts, for the toron_route_inflight gauge.
//
// A Bulkhead outlives route tables: the gateway keys bulkheads by route name so that a reload
// never resets an in-flight count (SPEC 4).
type Bulkhead struct {
	inflight atomic.Int64
	max      atomic.Int64
}

// NewBulkhead returns a bulkhead admitting at most max requests at once (0 = unlimited).
func NewBulkhead(max int) *Bulkhead {
	b := &Bulkhead{}
	b.SetMax(max)
	return b
}

// SetMax changes the ceiling (a reload may resize a route). Requests already admitted stay
// admitted; new ones see the new ceiling.
func (b *Bulkhead) SetMax(max int) {
	b.max.Store(int64(max))
}

// Max returns the ceiling; 0 means unlimited.
func (b *Bulkhead) Max() int64 {
	return b.max.Load()
}

// InFlight returns the number of requests holding a slot.
func (b *Bulkhead) InFlight() int64 {
	return b.inflight.Load()
}

// TryAcquire takes a slot without waiting; false means the bulkhead is full.
func (b *Bulkhead) TryAcquire() bool {
	for {
		n := b.inflight.Load()
		if m := b.max.Load(); m > 0 && n >= m {
			return false
		}
		if b.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release returns a slot taken by TryAcquire. Each successful TryAcquire is released exactly
// once; the caller owns that bookkeeping.
func (b *Bulkhead) Release() {
	if b.inflight.Add(-1) < 0 {
		panic("BUG: limits: Bulkhead released more often than acquired")
	}
}
