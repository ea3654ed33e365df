package gateway

import "strings"

// prefixTree holds the prefixes of one host group of the route table as a radix tree over
// their bytes: one walk down a request path meets every route prefix that the path starts
// with, and the way back up from the deepest one tries them longest first. Built by insert
// and seal, then only read.
type prefixTree struct {
	root prefixNode
}

// prefixNode is one node of a prefixTree. The bytes from the root to the end of label spell
// the prefix path[:depth]; routes are the routes whose prefix it is, in the order match tries
// them.
type prefixNode struct {
	label string
	// firsts holds the first byte of each child's label, children[i] the child of firsts[i].
	firsts   string
	children []*prefixNode
	routes   []routeCandidate
	depth    int         // length of the prefix this node spells
	up       *prefixNode // the nearest ancestor with routes, nil at the top
	// index maps a byte to 1 + its position in firsts, for a node with more children than
	// a scan of firsts should cover (seal builds it).
	index *[256]uint16
}

// indexedChildren is the fan-out from which a node gets an index.
const indexedChildren = 8

// routeCandidate is a route as a tree node keeps it.
type routeCandidate struct {
	index   int
	methods []string // nil: all methods
}

// insert adds a route under prefix. Routes must arrive in precedence order (newRouteTable
// sorts them): a node tries its routes in the order they were inserted. seal must follow the
// last insert.
func (t *prefixTree) insert(prefix string, r routeCandidate) {
	n := &t.root
	for prefix != "" {
		i := strings.IndexByte(n.firsts, prefix[0])
		if i < 0 {
			c := &prefixNode{label: prefix}
			n.firsts += prefix[:1]
			n.children = append(n.children, c)
			n = c
			break
		}
		c := n.children[i]
		common := 0
		for common < len(c.label) && common < len(prefix) && c.label[common] == prefix[common] {
			common++
		}
		if common < len(c.label) {
			// The prefix leaves c's label midway: split c there.
			mid := &prefixNode{label: c.label[:common], firsts: c.label[common : common+1], children: []*prefixNode{c}}
			c.label = c.label[common:]
			n.children[i] = mid
			c = mid
		}
		n = c
		prefix = prefix[common:]
	}
	n.routes = append(n.routes, r)
}

// seal lays the tree out compactly, then computes every node's depth and nearest ancestor
// with routes.
func (t *prefixTree) seal() {
	t.compact()
	var walk func(n *prefixNode, depth int, up *prefixNode)
	walk = func(n *prefixNode, depth int, up *prefixNode) {
		n.depth, n.up = depth, up
		if len(n.children) > indexedChildren {
			n.index = new([256]uint16)
			for i := 0; i < len(n.firsts); i++ {
				n.index[n.firsts[i]] = uint16(i + 1)
			}
		}
		if len(n.routes) > 0 {
			up = n
		}
		for _, c := range n.children {
			walk(c, depth+len(c.label), up)
		}
	}
	walk(&t.root, 0, nil)
}

// compact copies the nodes below the root into one array in depth-first order, their child
// lists, routes and label bytes into one array each: a lookup down a path then reads
// neighbouring memory instead of a separate allocation per node, label and list, which at
// thousands of routes is what a lookup waits for (BenchmarkRouteMatch at 10,000 routes).
func (t *prefixTree) compact() {
	var nodes, routes int
	var text strings.Builder
	var count func(n *prefixNode)
	count = func(n *prefixNode) {
		nodes += len(n.children)
		routes += len(n.routes)
		text.WriteString(n.label)
		text.WriteString(n.firsts)
		for _, c := range n.children {
			count(c)
		}
	}
	count(&t.root)
	all, off := text.String(), 0
	nodeArena := make([]prefixNode, 0, nodes)
	childArena := make([]*prefixNode, 0, nodes)
	routeArena := make([]routeCandidate, 0, routes)
	// The arenas never grow (their sizes were counted), so pointers into them stay valid.
	var copyNode func(dst, src *prefixNode)
	copyNode = func(dst, src *prefixNode) {
		dst.label = all[off : off+len(src.label)]
		off += len(src.label)
		dst.firsts = all[off : off+len(src.firsts)]
		off += len(src.firsts)
		start := len(routeArena)
		routeArena = append(routeArena, src.routes...)
		dst.routes = routeArena[start:len(routeArena):len(routeArena)]
		start = len(childArena)
		for range src.children {
			nodeArena = append(nodeArena, prefixNode{})
			childArena = append(childArena, &nodeArena[len(nodeArena)-1])
		}
		dst.children = childArena[start:len(childArena):len(childArena)]
		for i, c := range src.children {
			copyNode(dst.children[i], c)
		}
	}
	root := t.root
	t.root = prefixNode{}
	copyNode(&t.root, &root)
}

// match returns the index of the route with the longest prefix of path (at a segment
// boundary) that allows method, or -1.
func (t *prefixTree) match(path, method []byte) int {
	// Down: the deepest node whose prefix path starts with.
	n, pos := &t.root, 0
	for pos < len(path) {
		c := n.child(path[pos])
		if c == nil {
			break
		}
		end := pos + len(c.label)
		if end > len(path) || !labelAt(path[pos:end], c.label) {
			break
		}
		n, pos = c, end
	}
	if len(n.routes) == 0 {
		n = n.up
	}
	// Up: the prefixes of path, longest first.
	for ; n != nil; n = n.up {
		// path[:n.depth] matches at a segment boundary: the whole path, a prefix ending in
		// '/', or one followed by '/'. (An empty prefix, refused by config validation, acts
		// as "/".)
		if d := n.depth; d < len(path) && d > 0 && path[d-1] != '/' && path[d] != '/' {
			continue
		}
		for i := range n.routes {
			if methodMatch(method, n.routes[i].methods) {
				return n.routes[i].index
			}
		}
	}
	return -1
}

// child returns the child whose label starts with b, or nil.
func (n *prefixNode) child(b byte) *prefixNode {
	if n.index != nil {
		if i := n.index[b]; i > 0 {
			return n.children[i-1]
		}
		return nil
	}
	for i := 0; i < len(n.firsts); i++ {
		if n.firsts[i] == b {
			return n.children[i]
		}
	}
	return nil
}

// labelAt reports whether b equals label. Labels are mostly a few bytes long, where a loop
// costs less than the runtime's memequal call.
func labelAt(b []byte, label string) bool {
	if len(label) > 16 {
		return string(b) == label
	}
	for i := 0; i < len(label); i++ {
		if b[i] != label[i] {
			return false
		}
	}
	return true
}
