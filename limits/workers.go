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
type WorkerPool struct {
	sem  chan struct{}
	busy atomic.Int64
}

// NewWorkerPool returns a pool of size workers (at least 1).
func NewWorkerPool(size int) *WorkerPool {
	if size < 1 {
		size = 1
	}
	return &WorkerPool{sem: make(chan struct{}, size)}
}

// timerPool recycles the timers of waiting acquisitions: waiting is the slow path, but a
// saturated gateway waits on every request.
var timerPool sync.Pool

// Acquire takes a worker, waiting at most wait for one to free up; false means none did.
func (p *WorkerPool) Acquire(wait time.Duration) bool {
	select {
	case p.sem <- struct{}{}:
		p.busy.Add(1)
		return true
	default:
	}
	if wait <= 0 {
		return false
	}
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
	case p.sem <- struct{}{}:
		p.busy.Add(1)
		return true
	case <-t.C:
		return false
	}
}

// Release returns a worker taken by Acquire.
func (p *WorkerPool) Release() {
	p.busy.Add(-1)
	<-p.sem
}

// Busy returns the number of workers held.
func (p *WorkerPool) Busy() int64 {
	return p.busy.Load()
}

// Size returns the number of workers.
func (p *WorkerPool) Size() int {
	return cap(p.sem)
}
