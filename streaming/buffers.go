// Package streaming moves body bytes: pooled buffers, the strict chunked decoder (the framing
// validator of SPEC 7) and copying between client and upstream in constant memory (SPEC 6). It
// imports only the standard library: the gateway wires it to fasthttp.
package streaming

import "sync"

// BufferSize is the size of the one body buffer a streaming exchange holds at a time: SPEC 6
// bounds body buffers to 64 KiB per connection, and 64 KiB reads keep loopback and LAN copies
// near line rate.
const BufferSize = 64 << 10

var bufferPool = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}

// GetBuffer takes a BufferSize buffer from the pool. Return it with PutBuffer.
func GetBuffer() *[]byte { return bufferPool.Get().(*[]byte) }

// PutBuffer returns a buffer taken by GetBuffer.
func PutBuffer(b *[]byte) { bufferPool.Put(b) }
