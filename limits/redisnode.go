package limits

import (
	"bufio"
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// The connections of server.redis are made in the background, never while a decision waits
// (SPEC 17: no request waits longer than timeout): a dial, a TLS handshake and the set-up
// commands cost several round trips, more than a decision's timeout, and a Redis that accepts
// but does not answer would hold every caller for the dial's own bound. Each node keeps one
// connection; when it dies (a failed read or write, a hung Redis) the node dials a new one in
// the background, and the decisions meanwhile fail at once (ErrRedisReconnecting: on_error
// decides) instead of waiting. A connection is installed only once it is set up: AUTH, SELECT,
// CLIENT SETNAME and SCRIPT LOAD, pipelined in one write, so a decision on it is one round trip
// from the first.

// redisDialTimeout bounds one background dial, its TLS handshake and its set-up commands. No
// decision waits for it.
const redisDialTimeout = time.Second

// redisRedialPause is the pause after a failed background dial before the next: a Redis that
// comes back is connected within it, so the breaker's next probe (SPEC 17: within 1 s) finds a
// connection ready.
const redisRedialPause = 100 * time.Millisecond

// ErrRedisReconnecting is the error of a call that found no connection to Redis: one is being
// made in the background, and the call does not wait for it.
var ErrRedisReconnecting = errors.New("limits: redis connection being made, not waited for")

// gcraSHA is the SHA-1 of the decision script, its name for EVALSHA.
var gcraSHA = func() string {
	h := sha1.Sum([]byte(gcraScript))
	return hex.EncodeToString(h[:])
}()

// redisNode is one Redis server (the standalone one, or a cluster's master) and its connection.
type redisNode struct {
	addr    string
	r       *Redis
	conn    atomic.Pointer[pipeConn]
	dialing atomic.Bool
}

// node returns the node of addr, made on first use.
func (r *Redis) node(addr string) *redisNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[addr]
	if n == nil {
		n = &redisNode{addr: addr, r: r}
		r.nodes[addr] = n
	}
	return n
}

// ready returns the node's connection, or nil with a background dial started.
func (n *redisNode) ready() *pipeConn {
	if c := n.conn.Load(); c != nil {
		return c
	}
	n.redial()
	return nil
}

// install makes nc, set up, the node's connection.
func (n *redisNode) install(nc net.Conn) {
	c := newPipeConn(nc, n.died)
	if old := n.conn.Swap(c); old != nil {
		old.Close()
	}
}

// died is told by a connection that closed: the node dials anew.
func (n *redisNode) died(c *pipeConn) {
	if n.conn.CompareAndSwap(c, nil) {
		n.redial()
		if t := n.r.topo.Load(); t != nil && t.single == nil {
			n.r.refreshSlots(t) // a master gone: its slots may have a new one
		}
	}
}

// redial starts the background dial unless one is running or the client is closed.
func (n *redisNode) redial() {
	if !n.dialing.CompareAndSwap(false, true) {
		return
	}
	r := n.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		n.dialing.Store(false)
		return
	}
	r.wg.Add(1)
	go n.dialLoop()
}

// dialLoop dials until a connection is set up (and installed), the client is closed, or (in a
// cluster) the map no longer names the node: a master that failed over is not dialed forever.
func (n *redisNode) dialLoop() {
	defer n.r.wg.Done()
	for {
		if t := n.r.topo.Load(); t != nil && t.single == nil && !t.names(n.addr) {
			n.dialing.Store(false)
			return
		}
		nc, _, err := n.r.dialNode(n.addr, false)
		if err == nil {
			n.r.mu.Lock()
			closed := n.r.closed
			// Cleared before the connection is installed: if it dies at once, its death
			// starts the next dial.
			n.dialing.Store(false)
			if !closed {
				n.install(nc)
			}
			n.r.mu.Unlock()
			if closed {
				nc.Close()
			}
			return
		}
		if t := n.r.topo.Load(); t != nil && t.single == nil {
			n.r.refreshSlots(t) // a master that does not answer may have been replaced
		}
		t := time.NewTimer(redisRedialPause)
		select {
		case <-n.r.ctx.Done():
			t.Stop()
			n.dialing.Store(false)
			return
		case <-t.C:
		}
	}
}

// dialNode dials addr and sets the connection up; with slots, it also asks for the cluster's
// map (CLUSTER SLOTS), returned as the reply (an error reply from a standalone server).
func (r *Redis) dialNode(addr string, slots bool) (net.Conn, respValue, error) {
	ctx, cancel := context.WithTimeout(r.ctx, redisDialTimeout)
	defer cancel()
	nd := &net.Dialer{KeepAlive: 15 * time.Second}
	var nc net.Conn
	var err error
	if r.opts.TLS == nil {
		nc, err = nd.DialContext(ctx, "tcp", addr)
	} else {
		td := tls.Dialer{NetDialer: nd, Config: r.opts.TLS}
		nc, err = td.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, respValue{}, err
	}
	deadline, _ := ctx.Deadline()
	_ = nc.SetDeadline(deadline)
	var names []string
	var b []byte
	if r.opts.Password != "" {
		if r.opts.Username != "" {
			b = appendCommand(b, "AUTH", r.opts.Username, r.opts.Password)
		} else {
			b = appendCommand(b, "AUTH", r.opts.Password)
		}
		names = append(names, "AUTH")
	}
	if r.opts.DB != 0 {
		b = appendCommand(b, "SELECT", strconv.Itoa(r.opts.DB))
		names = append(names, "SELECT")
	}
	b = appendCommand(b, "CLIENT", "SETNAME", "toron")
	b = appendCommand(b, "SCRIPT", "LOAD", gcraScript)
	names = append(names, "CLIENT SETNAME", "SCRIPT LOAD")
	if slots {
		b = appendCommand(b, "CLUSTER", "SLOTS")
		names = append(names, "CLUSTER SLOTS")
	}
	fail := func(err error) (net.Conn, respValue, error) {
		nc.Close()
		return nil, respValue{}, fmt.Errorf("limits: redis %s: %w", addr, err)
	}
	if _, err := nc.Write(b); err != nil {
		return fail(err)
	}
	br := bufio.NewReaderSize(nc, 4096)
	var last respValue
	for _, name := range names {
		v, err := readValue(br, 0)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", name, err))
		}
		switch {
		case name == "CLUSTER SLOTS":
			last = v
		case name == "CLIENT SETNAME":
			// An old server or an ACL user without CLIENT: the name is a courtesy.
		case v.err() != nil:
			return fail(fmt.Errorf("%s: %w", name, v.err()))
		case name == "SCRIPT LOAD" && v.str != gcraSHA:
			return fail(fmt.Errorf("SCRIPT LOAD answered %q, want %s", v.str, gcraSHA))
		}
	}
	if br.Buffered() > 0 {
		return fail(errRedisProtocol)
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, last, nil
}

// run sends one decision to the node of its key and follows Redis's answers: NOSCRIPT (a
// restarted server's empty script cache: EVAL with the script, once), and in a cluster MOVED
// (the slot has a new master: the map is corrected, the decision sent there once) and ASK (the
// slot is being migrated: ASKING and the decision, at the node named, once).
func (r *Redis) run(t *redisTopology, ctx context.Context, deadline time.Time, now int64, keyPrefix string, keySuffix []byte, args []string) verdictReply {
	n := t.nodeOf(keyPrefix, keySuffix)
	verb, src := "EVALSHA", gcraSHA
	asking := false
	for tries := 0; tries < 3; tries++ {
		var c *pipeConn
		if n != nil {
			c = n.ready()
		}
		if c == nil {
			if t.single == nil {
				r.refreshSlots(t) // the slot's master is unreachable: it may have a new one
			}
			return verdictReply{err: ErrRedisReconnecting}
		}
		res := c.do(ctx, deadline, now, asking, scriptCmd{verb, src, keyPrefix, keySuffix, args})
		re, ok := res.err.(redisError)
		if !ok {
			return res
		}
		switch {
		case re.prefix("NOSCRIPT"):
			verb, src = "EVAL", gcraScript
		case re.prefix("MOVED"), re.prefix("ASK"):
			slot, addr, ok := parseRedirect(string(re))
			if !ok || t.single != nil {
				return res
			}
			n = r.node(addr)
			asking = re.prefix("ASK")
			if !asking {
				t.move(slot, n)
				r.refreshSlots(t)
			}
		case re.prefix("CLUSTERDOWN"), re.prefix("TRYAGAIN"):
			r.refreshSlots(t) // a failover or a resharding under way
			return res
		default:
			return res
		}
	}
	return verdictReply{err: errRedisRedirects}
}

var errRedisRedirects = errors.New("limits: redis redirected a decision more than twice")
