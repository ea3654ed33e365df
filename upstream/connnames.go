// This file owns the hop-by-hop rules of a message head crossing the proxy, in either
// direction (SPEC 7, RFC 9110 7.6.1): the fixed hop-by-hop headers, the set of names the
// Connection lines add (ConnNames), and the copy of a response head's end-to-end headers.
package upstream

import (
	"bytes"
	"hash/maphash"
	"sync"

	"github.com/valyala/fasthttp"
)

// ConnNames is the set of header names the Connection header lines of one message name (RFC
// 9110 7.6.1: they are hop-by-hop too; several lines are one list, RFC 9110 5.3). Building it
// and asking it about every header of the message costs time linear in the header section:
// a Connection header listing thousands of tokens beside hundreds of headers once cost a scan of
// the whole list per header (38-44x a plain request of the same size, issue 14).
//
// A list of at most smallConnTokens tokens (the real ones: close, keep-alive, Upgrade, TE) is
// scanned, in a buffer on the caller's stack. A longer one is put in a hash table with a
// per-process random seed (hash/maphash), so that no one can choose names that collide; the
// table comes from a pool, so a long list does not allocate either once the pool is warm.
type ConnNames struct {
	list []byte // the tokens, lower-cased, each followed by ','
	n    int    // tokens in list
	big  *ConnTable
}

// smallConnTokens is the longest list that is scanned rather than hashed.
const smallConnTokens = 8

// ConnTable is the hash table of a long Connection list (pooled: ReleaseConnTable).
type ConnTable struct {
	buf   []byte   // backing store of ConnNames.list when it does not fit on the stack
	spans []uint64 // start<<32 | end of each distinct token in list
	slots []int32  // open addressing, linear probing: index+1 into spans, 0 for empty
	key   []byte   // the lower-cased name being looked up
}

// maxPooledConnTable bounds what a table keeps when it goes back to the pool: a rare huge
// header section must not pin its memory.
const maxPooledConnTable = 64 << 10

var (
	connTablePool = sync.Pool{New: func() any { return new(ConnTable) }}
	connSeed      = maphash.MakeSeed()
)

// CollectConnNames reads the values of the Connection lines (PeekAll(HeaderConnection): a
// slice, not an iterator, so that nothing escapes to the heap). stack is the caller's buffer
// for a short list. table is the pooled hash table of a long list (nil otherwise): the caller
// gives it back with ReleaseConnTable once the names are no longer asked about. It is returned
// apart, and kept in its own variables here, because escape analysis does not tell a struct's
// fields apart: releasing it through the ConnNames would move the stack buffer to the heap.
func CollectConnNames(stack []byte, lines [][]byte) (c ConnNames, table *ConnTable) {
	size := 0
	for _, v := range lines {
		size += len(v) + 1
	}
	if size == 0 {
		return ConnNames{}, nil
	}
	var list []byte
	var n int
	if size <= cap(stack) {
		list, n = appendConnTokens(stack[:0], lines)
	} else {
		table = connTablePool.Get().(*ConnTable)
		table.buf, n = appendConnTokens(table.buf[:0], lines)
		list = table.buf
	}
	if n > smallConnTokens {
		if table == nil {
			table = connTablePool.Get().(*ConnTable)
		}
		table.build(list, n)
	}
	return ConnNames{list: list, n: n, big: table}, table
}

// appendConnTokens appends the tokens of the Connection values to dst, lower-cased, each
// followed by ','; n counts them. Empty list elements are skipped (RFC 9110 5.6.1).
func appendConnTokens(dst []byte, lines [][]byte) (list []byte, n int) {
	for _, v := range lines {
		for len(v) > 0 {
			var tok []byte
			tok, v, _ = bytes.Cut(v, comma)
			if tok = bytes.Trim(tok, " \t"); len(tok) == 0 {
				continue
			}
			dst = appendLower(dst, tok)
			dst = append(dst, ',')
			n++
		}
	}
	return dst, n
}

// build indexes the n tokens of list, each once.
func (t *ConnTable) build(list []byte, n int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	if cap(t.slots) >= size {
		t.slots = t.slots[:size]
		clear(t.slots)
	} else {
		t.slots = make([]int32, size)
	}
	t.spans = t.spans[:0]
	mask := size - 1
	for start := 0; start < len(list); {
		end := start + bytes.IndexByte(list[start:], ',')
		tok := list[start:end]
		for i := int(maphash.Bytes(connSeed, tok)) & mask; ; i = (i + 1) & mask {
			s := t.slots[i]
			if s == 0 {
				t.spans = append(t.spans, uint64(start)<<32|uint64(end))
				t.slots[i] = int32(len(t.spans))
				break
			}
			// A repeated token is stored once, so that repeating one name cannot build a long
			// probe chain for the names that hash next to it.
			if sp := t.spans[s-1]; bytes.Equal(list[sp>>32:uint32(sp)], tok) {
				break
			}
		}
		start = end + 1
	}
}

// Has reports whether the Connection lines name the header k (case-insensitive).
func (c *ConnNames) Has(k []byte) bool {
	switch {
	case c.n == 0:
		return false
	case c.n <= smallConnTokens:
		for list := c.list; len(list) > 0; {
			var tok []byte
			tok, list, _ = bytes.Cut(list, comma)
			if bytes.EqualFold(tok, k) {
				return true
			}
		}
		return false
	}
	t := c.big
	t.key = appendLower(t.key[:0], k)
	mask := len(t.slots) - 1
	for i := int(maphash.Bytes(connSeed, t.key)) & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return false
		}
		if sp := t.spans[s-1]; bytes.Equal(c.list[sp>>32:uint32(sp)], t.key) {
			return true
		}
	}
}

// ReleaseConnTable gives a long list's table back to the pool (nil: nothing to do).
func ReleaseConnTable(t *ConnTable) {
	if t == nil || cap(t.buf) > maxPooledConnTable || cap(t.slots) > maxPooledConnTable || cap(t.key) > maxPooledConnTable {
		return
	}
	connTablePool.Put(t)
}

// appendLower appends b to dst with ASCII upper case folded to lower case.
func appendLower(dst, b []byte) []byte {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

var comma = []byte{','}

// hopByHop are the headers of one connection, never forwarded in either direction (SPEC 7,
// RFC 9110 7.6.1), besides those the Connection header names. Expect is among them: Toron
// answers it itself (SPEC 3 step 7).
var hopByHop = [][]byte{
	[]byte("Expect"),
	[]byte("Connection"),
	[]byte("Keep-Alive"),
	[]byte("Proxy-Connection"),
	[]byte("TE"),
	[]byte("Trailer"),
	[]byte("Transfer-Encoding"),
	[]byte("Upgrade"),
}

// IsHopByHop reports one of the fixed hop-by-hop headers (case-insensitive).
func IsHopByHop(k []byte) bool {
	for _, h := range hopByHop {
		if bytes.EqualFold(k, h) {
			return true
		}
	}
	return false
}

var hdrContentLength = []byte("Content-Length")

// CopyResponseHeaders copies the upstream's end-to-end response headers to the client response.
// Content-Length and framing are set by the body that follows.
func CopyResponseHeaders(dst, src *fasthttp.ResponseHeader) { CopyResponseHeadersExcept(dst, src, nil) }

// CopyResponseHeadersExcept is CopyResponseHeaders without the headers named in except
// (canonical names, as fasthttp parses them: "X-Powered-By"), which a route's rules remove:
// a header not copied need not be deleted afterwards.
func CopyResponseHeadersExcept(dst, src *fasthttp.ResponseHeader, except [][]byte) {
	var stack [128]byte
	named, table := CollectConnNames(stack[:0], src.PeekAll(fasthttp.HeaderConnection))
	defer ReleaseConnTable(table)
	for k, v := range src.All() {
		if IsHopByHop(k) || named.Has(k) || bytes.EqualFold(k, hdrContentLength) || excepted(except, k) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

func excepted(names [][]byte, k []byte) bool {
	for _, name := range names {
		if bytes.Equal(name, k) {
			return true
		}
	}
	return false
}
