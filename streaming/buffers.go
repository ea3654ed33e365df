// Package streaming moves body bytes: pooled buffers, the strict chunked decoder (the framing
// validator of SPEC 7) and copying between client and upstream in constant memory (SPEC 6). It
// imports only the standard library: the gateway wires it to fasthttp.
package streaming

import (
	"io"
	"sync"
)

// BufferSize is the size of the one body buffer a streaming exchange holds at a time: SPEC 6
// bounds body buffers to 64 KiB per connection, and 64 KiB reads keep loopback and LAN copies
// near line rate.
const BufferSize = 64 << 10

var bufferPool = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}

// GetBuffer takes a BufferSize buffer from the pool. Return it with PutBuffer.
func GetBuffer() *[]byte { return bufferPool.Get().(*[]byte) }

// PutBuffer returns a buffer taken by GetBuffer.
func PutBuffer(b *[]byte) { bufferPool.Put(b) }

// CopyBuffer copies from src to dst through buf until src returns io.EOF. Unlike io.CopyBuffer
// it never delegates to src's WriteTo or dst's ReadFrom: the gateway's body readers call it
// from their own WriteTo, and the copy must go through their Read (counting, limits, deadlines).
func CopyBuffer(dst io.Writer, src io.Reader, buf []byte) (int64, error) {
	var total int64
	for {
		n, err := src.Read(buf)
		if n > 0 {
			m, werr := dst.Write(buf[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
