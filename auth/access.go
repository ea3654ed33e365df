package auth

import "net/netip"

// Access is a route's access lists (SPEC 19): deny first, then, when allow is not empty, the
// client IP must be in it. A nil *Access allows everyone.
type Access struct {
	allow, deny []netip.Prefix
}

// NewAccess returns the access lists of allow and deny; nil when both are empty. IPv4-mapped
// IPv6 prefixes should already be unmapped (conf.ParsePrefix does it).
func NewAccess(allow, deny []netip.Prefix) *Access {
	if len(allow) == 0 && len(deny) == 0 {
		return nil
	}
	return &Access{allow: allow, deny: deny}
}

// Allows reports whether ip may use the route. An IPv4-mapped IPv6 address is matched as the
// IPv4 address it carries; an invalid address (none known) is refused by a non-empty allow list
// and passes a deny-only list.
func (a *Access) Allows(ip netip.Addr) bool {
	if a == nil {
		return true
	}
	ip = ip.Unmap()
	for _, p := range a.deny {
		if p.Contains(ip) {
			return false
		}
	}
	if len(a.allow) == 0 {
		return true
	}
	for _, p := range a.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
