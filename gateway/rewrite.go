package gateway

import (
	"github.com/valyala/fasthttp"

	"toron/conf"
)

// Path rewriting (SPEC 16): strip_prefix and add_prefix act on the normalized path that was
// matched (x.path), never on fasthttp's decoded URI.Path (SPEC 12), so a %2F stays %2F and the
// upstream gets exactly the segments Toron matched. The query is appended byte for byte by the
// caller. Matching never sees the rewritten path.

// rewrite is a route's rewriting, precomputed when the route table is built.
type rewrite struct {
	// strip is the number of leading path bytes removed: the prefix without its trailing "/"
	// (0 without strip_prefix). A path that matched the prefix at a segment boundary continues
	// after them with "/" or ends there.
	strip int
	// add is prepended after the strip (nil: nothing).
	add []byte
	// forwardedPrefix is the X-Forwarded-Prefix value: the removed prefix (nil when nothing is
	// removed).
	forwardedPrefix []byte
}

func newRewrite(rc *conf.Route) rewrite {
	var rw rewrite
	if rc.StripPrefix {
		p := conf.StrippedPrefix(rc.Prefix)
		rw.strip = len(p)
		if p != "" {
			rw.forwardedPrefix = []byte(p)
		}
	}
	if rc.AddPrefix != "" {
		rw.add = []byte(rc.AddPrefix)
	}
	return rw
}

// appendForwardPath appends the path forwarded upstream for the normalized path that matched
// the route, without allocating beyond dst's growth (conf.RewritePath is the reference).
func (r *route) appendForwardPath(dst, path []byte) []byte {
	rw := &r.rw
	if rw.strip == 0 && rw.add == nil {
		return append(dst, path...)
	}
	rest := path
	if rw.strip > 0 && rw.strip <= len(path) {
		rest = path[rw.strip:]
	}
	if rw.add != nil {
		dst = append(dst, rw.add...)
		return append(dst, rest...)
	}
	if len(rest) == 0 {
		return append(dst, '/')
	}
	return append(dst, rest...)
}

// setForwardedPrefix tells the upstream what strip_prefix removed (X-Forwarded-Prefix, replacing
// any the client sent); a route that strips nothing leaves the header as it came.
func (r *route) setForwardedPrefix(h *fasthttp.RequestHeader) {
	if r.rw.forwardedPrefix == nil {
		return
	}
	h.DelBytes(hdrXForwardedPrefix)
	h.SetBytesKV(hdrXForwardedPrefix, r.rw.forwardedPrefix)
}
