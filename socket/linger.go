// This file owns the lingering close: half-close, then drain briefly, so that an answer sent
// while the peer still sends reaches it instead of a reset.
package socket

import (
	"net"
	"sync"
	"time"
)

// Lingering close: a rejection sent while the client is still sending its body reaches the client
// as a reset (the kernel answers unread data with RST) unless the connection is half-closed and
// drained briefly first, as Go's net/http closeWriteAndWait does.
const (
	lingerTimeout  = 500 * time.Millisecond
	lingerMaxBytes = 256 << 10
)

// LingerClose half-closes c and reads what the peer still sends, for at most lingerTimeout and
// lingerMaxBytes; the caller closes c afterwards. c must be the socket itself (Below), not a
// TLS layer, whose CloseWrite would send close_notify; a c that cannot half-close is left alone.
func LingerClose(c net.Conn) {
	tc, ok := c.(interface {
		net.Conn
		CloseWrite() error
	})
	if !ok {
		return
	}
	if tc.CloseWrite() != nil {
		return
	}
	if tc.SetReadDeadline(time.Now().Add(lingerTimeout)) != nil {
		return
	}
	buf := lingerBufPool.Get().(*[]byte)
	defer lingerBufPool.Put(buf)
	for total := 0; total < lingerMaxBytes; {
		n, err := tc.Read(*buf)
		total += n
		if err != nil {
			return
		}
	}
}

var lingerBufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}
