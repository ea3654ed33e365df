package limits

import (
	"sync"
	"sync/atomic"
	"time"
)

// WorkerPool bounds the requests the gateway processes at once, from admission to the end of
// the response (SPEC 4). It counts requests, not connections: an idle keep-alive connection or
// one still sending its headers holds no worker, which is what keeps a Slowloris crowd from
// starving real traffic. A request that finds every worker busy waits at most the queue
// timeout given to Acquire.
//
// The pool is an atomic counter; a wait queue exists only while the pool is saturated. Acquire
// and Release of an unsaturated pool are one compare-and-swap and one add: no lock, no channel.
// A Release that finds waiters hands its slot to the oldest one directly, so a waiter never
// races a newcomer for a slot it was promised.
type WorkerPool struct {
	size int64
	busy atomic.Int64
	// nwait counts the waiters; Release takes the lock only when it is not zero.
	nwait atomic.Int64

	mu      sync.Mutex
	waiters []*waiter
}

// waiter is one Acquire waiting for a slot; ch receives the slot when a Release hands it over.
type waiter struct {
	ch chan struct{}
}

// NewWorkerPool returns a pool of size workers (at least 1).
func NewWorkerPool(size int) *WorkerPool {
	if size < 1 {
		size = 1
	}
	return &WorkerPool{size: int64(size)}
}

// timerPool and waiterPool recycle the timers and waiters of waiting acquisitions: waiting is
// the slow path, but a saturated gateway waits on every request.
var (
	timerPool  sync.Pool
	waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}
)

// tryAcquire takes a slot if one is free.
func (p *WorkerPool) tryAcquire() bool { return addBelow(&p.busy, p.size) }

// addBelow adds one to n unless that would take it past limit, and reports whether it did:
// a count that concurrent callers never push over its bound.
func addBelow(n *atomic.Int64, limit int64) bool {
	for {
		v := n.Load()
		if v >= limit {
			return false
		}
		if n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// Acquire takes a worker, waiting at most wait for one to free up; false means none did.
func (p *WorkerPool) Acquire(wait time.Duration) bool {
	if p.tryAcquire() {
		return true
	}
	if wait <= 0 {
		return false
	}
	w := waiterPool.Get().(*waiter)
	p.mu.Lock()
	// nwait is raised before the second look: a Release that lowered busy before it saw no
	// waiter, so the look finds its slot; one that lowers busy after it sees the waiter.
	p.nwait.Add(1)
	if p.tryAcquire() {
		p.nwait.Add(-1)
		p.mu.Unlock()
		waiterPool.Put(w)
		return true
	}
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()

	t, _ := timerPool.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(wait)
	} else {
		t.Reset(wait)
	}
	defer func() {
		t.Stop()
		timerPool.Put(t)
	}()
	select {
	case <-w.ch:
		waiterPool.Put(w)
		return true
	case <-t.C:
	}
	p.mu.Lock()
	for i, q := range p.waiters {
		if q == w {
			copy(p.waiters[i:], p.waiters[i+1:])
			p.waiters[len(p.waiters)-1] = nil
			p.waiters = p.waiters[:len(p.waiters)-1]
			p.nwait.Add(-1)
			p.mu.Unlock()
			waiterPool.Put(w)
			return false
		}
	}
	p.mu.Unlock()
	// A Release handed the slot over as the timer fired: it is ours.
	<-w.ch
	waiterPool.Put(w)
	return true
}

// Release returns a worker taken by Acquire.
func (p *WorkerPool) Release() {
	p.busy.Add(-1)
	if p.nwait.Load() == 0 {
		return
	}
	p.mu.Lock()
	for len(p.waiters) > 0 && p.tryAcquire() {
		w := p.waiters[0]
		copy(p.waiters, p.waiters[1:])
		p.waiters[len(p.waiters)-1] = nil
		p.waiters = p.waiters[:len(p.waiters)-1]
		p.nwait.Add(-1)
		w.ch <- struct{}{}
	}
	p.mu.Unlock()
}

// Busy returns the number of workers held.
func (p *WorkerPool) Busy() int64 {
	return p.busy.Load()
}

// Size returns the number of workers.
func (p *WorkerPool) Size() int {
	return int(p.size)
}
