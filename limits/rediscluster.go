package limits

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Redis Cluster: the map from the 16384 hash slots to their masters, read with CLUSTER SLOTS
// when the client connects and again, in the background, when a MOVED reply shows it stale. A
// key's slot is the CRC-16 (XMODEM) of its hash tag, the text between the first { and the
// next } when that is not empty, else of the whole key, modulo 16384 (the Redis Cluster
// specification). Every key of a route shares the tag {ROUTE}, so it shares one slot and one
// node; the script touches that key alone.

const redisSlots = 16384

// redisSlotsRefreshPause is the least time between two background refreshes of the map.
const redisSlotsRefreshPause = time.Second

// redisTopology is where decisions go: one standalone node, or a node per slot.
type redisTopology struct {
	single      *redisNode
	slots       []atomic.Pointer[redisNode] // redisSlots of them, cluster only
	refreshing  atomic.Bool
	lastRefresh atomic.Int64                    // unix nanoseconds
	masters     atomic.Pointer[map[string]bool] // the addresses the latest map named
}

// names reports whether the latest map of the cluster names addr as a master.
func (t *redisTopology) names(addr string) bool {
	m := t.masters.Load()
	return m == nil || (*m)[addr]
}

// nodeOf returns the node serving the key keyPrefix+keySuffix.
func (t *redisTopology) nodeOf(keyPrefix string, keySuffix []byte) *redisNode {
	if t.single != nil {
		return t.single
	}
	if n := t.slots[keySlot(keyPrefix, keySuffix)].Load(); n != nil {
		return n
	}
	// A slot no master serves (a cluster being set up): any node answers MOVED or an error.
	for i := range t.slots {
		if n := t.slots[i].Load(); n != nil {
			return n
		}
	}
	return nil
}

// move records that slot is served by n (a MOVED reply).
func (t *redisTopology) move(slot int, n *redisNode) {
	if slot >= 0 && slot < len(t.slots) {
		t.slots[slot].Store(n)
	}
}

// keySlot is the cluster slot of the key prefix+suffix.
func keySlot(prefix string, suffix []byte) int {
	var buf [256]byte
	k := append(append(buf[:0], prefix...), suffix...)
	if i := bytes.IndexByte(k, '{'); i >= 0 {
		if j := bytes.IndexByte(k[i+1:], '}'); j > 0 {
			k = k[i+1 : i+1+j]
		}
	}
	return int(crc16(0, k) % redisSlots)
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(c uint16, b []byte) uint16 {
	for _, x := range b {
		c = c<<8 ^ crcTable[byte(c>>8)^x]
	}
	return c
}

// parseRedirect reads "MOVED 3999 127.0.0.1:6381" (or ASK).
func parseRedirect(msg string) (slot int, addr string, ok bool) {
	f := strings.Fields(msg)
	if len(f) != 3 {
		return 0, "", false
	}
	slot, err := strconv.Atoi(f[1])
	if err != nil || slot < 0 || slot >= redisSlots {
		return 0, "", false
	}
	return slot, f[2], true
}

// discover connects to addr and returns the topology found there: the standalone server, or the
// cluster whose map it holds, with a connection made to every master (each bounded by
// redisDialTimeout; one that fails is dialed again in the background). nil when addr does not
// answer.
func (r *Redis) discover(addr string) *redisTopology {
	nc, slots, err := r.dialNode(addr, true)
	if err != nil {
		return nil
	}
	if slots.kind != '*' {
		// "ERR This instance has cluster support disabled": a standalone server.
		n := r.node(addr)
		n.install(nc)
		return &redisTopology{single: n}
	}
	t := &redisTopology{slots: make([]atomic.Pointer[redisNode], redisSlots)}
	masters := r.applySlots(t, slots, addr)
	if len(masters) == 0 {
		nc.Close()
		return nil
	}
	installed := false
	for _, n := range masters {
		if n.addr == addr && n.conn.Load() == nil {
			n.install(nc)
			installed = true
			continue
		}
		if n.conn.Load() != nil {
			continue
		}
		if c, _, err := r.dialNode(n.addr, false); err == nil {
			n.install(c)
		} else {
			n.redial()
		}
	}
	if !installed {
		nc.Close()
	}
	return t
}

// applySlots stores the map of a CLUSTER SLOTS reply (from the node at from) in t and returns
// its masters.
func (r *Redis) applySlots(t *redisTopology, v respValue, from string) []*redisNode {
	fromHost, _, _ := net.SplitHostPort(from)
	seen := map[string]*redisNode{}
	var masters []*redisNode
	for _, e := range v.arr {
		if len(e.arr) < 3 || len(e.arr[2].arr) < 2 {
			continue
		}
		lo, hi := int(e.arr[0].num), int(e.arr[1].num)
		host, port := e.arr[2].arr[0].str, e.arr[2].arr[1].num
		if host == "" || host == "?" {
			host = fromHost
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		n := seen[addr]
		if n == nil {
			n = r.node(addr)
			seen[addr] = n
			masters = append(masters, n)
		}
		for s := max(0, lo); s <= hi && s < redisSlots; s++ {
			t.slots[s].Store(n)
		}
	}
	if len(masters) > 0 {
		named := make(map[string]bool, len(masters))
		for _, n := range masters {
			named[n.addr] = true
		}
		t.masters.Store(&named)
	}
	return masters
}

// refreshSlots reads the cluster's map again in the background (after a MOVED), at most once a
// redisSlotsRefreshPause.
func (r *Redis) refreshSlots(t *redisTopology) {
	if time.Now().UnixNano()-t.lastRefresh.Load() < int64(redisSlotsRefreshPause) || !t.refreshing.CompareAndSwap(false, true) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		t.refreshing.Store(false)
		return
	}
	addrs := append([]string(nil), r.opts.Addrs...)
	for a := range r.nodes {
		addrs = append(addrs, a)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer t.refreshing.Store(false)
		t.lastRefresh.Store(time.Now().UnixNano())
		for _, a := range addrs {
			nc, v, err := r.dialNode(a, true)
			if err != nil {
				continue
			}
			nc.Close()
			if v.kind == '*' {
				for _, n := range r.applySlots(t, v, a) {
					n.ready() // dials a master not known before
				}
				return
			}
		}
	}()
}
