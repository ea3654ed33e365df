package gateway

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// unsupportedExpectation reports a request whose Expect header asks for something other than
// 100-continue (case-insensitive, RFC 9110 10.1.1): it is answered 417 before any body byte
// (SPEC 7), decided from the headers like the other rejects. Obfuscated forms such as
// "y 100-continue" or "100-continue, x" are such other expectations: a server that read them
// as 100-continue and one that did not would disagree about whether a body follows at once.
// Expect itself is Toron's to answer (SPEC 3 step 7) and is never forwarded (hopByHop): an
// upstream that saw it could answer before the body arrived and then read the body as a
// request. A 100-continue on HTTP/1.0 is ignored (RFC 9110 10.1.1), as fasthttp does.
func unsupportedExpectation(h *fasthttp.RequestHeader) bool {
	for _, v := range h.PeekAll(fasthttp.HeaderExpect) {
		if !equalFold(bytes.Trim(v, " \t"), expect100Continue) {
			return true
		}
	}
	return false
}

var (
	expect100Continue = []byte("100-continue")
	hdrExpect         = []byte(fasthttp.HeaderExpect)
)
