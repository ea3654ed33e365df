package auth

import (
	"sync"
	"time"
)

// cache is a bounded map of verified credentials to their expiry. When it is full, expired
// entries are swept; when none has expired, an arbitrary entry (Go's map order) makes room:
// a cache miss only costs one more verification, and the bound is what keeps a flood of
// distinct valid credentials from growing memory.
type cache[K comparable, V any] struct {
	mu      sync.RWMutex
	max     int
	entries map[K]cacheEntry[V]
}

// cacheEntry is one cached value with the time it stops being valid.
type cacheEntry[V any] struct {
	until time.Time
	val   V
}

// newCache returns a cache of at most max entries.
func newCache[K comparable, V any](max int) *cache[K, V] {
	return &cache[K, V]{max: max, entries: make(map[K]cacheEntry[V], min(max, 1024))}
}

// get returns the value of k while it is valid at now.
func (c *cache[K, V]) get(k K, now time.Time) (V, bool) {
	c.mu.RLock()
	e, ok := c.entries[k]
	c.mu.RUnlock()
	if !ok || !now.Before(e.until) {
		var zero V
		return zero, false
	}
	return e.val, true
}

// put stores v for k until until.
func (c *cache[K, V]) put(k K, v V, until time.Time, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; !ok && len(c.entries) >= c.max {
		for key, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, key)
			}
		}
		for key := range c.entries {
			if len(c.entries) < c.max {
				break
			}
			delete(c.entries, key)
		}
	}
	c.entries[k] = cacheEntry[V]{until: until, val: v}
}

// len is the number of entries, expired ones included.
func (c *cache[K, V]) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}
