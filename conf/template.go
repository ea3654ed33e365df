package conf

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Placeholder is a per-request value a Template can hold (SPEC 20): redirect targets use
// {host} {uri} {path} {query} {scheme}, header rules {client_ip} {request_id} {route} {host}.
type Placeholder uint8

// The placeholders, in the order of their names below.
const (
	// PlaceholderHost is the request's host, without its port.
	PlaceholderHost Placeholder = iota + 1
	// PlaceholderURI is the path and query as received.
	PlaceholderURI
	// PlaceholderPath is the path as received, without the query.
	PlaceholderPath
	// PlaceholderQuery is the query without its "?" ("" when there is none).
	PlaceholderQuery
	// PlaceholderScheme is "http" or "https": the listener's, or a trusted X-Forwarded-Proto.
	PlaceholderScheme
	// PlaceholderClientIP is the client's IP address (SPEC 16).
	PlaceholderClientIP
	// PlaceholderRequestID is the request id (SPEC 8).
	PlaceholderRequestID
	// PlaceholderRoute is the route's name.
	PlaceholderRoute
)

// placeholderNames are the names written between braces, indexed by Placeholder.
var placeholderNames = [...]string{"", "host", "uri", "path", "query", "scheme", "client_ip", "request_id", "route"}

// String returns the placeholder as written, "{host}".
func (p Placeholder) String() string {
	if int(p) < len(placeholderNames) && p != 0 {
		return "{" + placeholderNames[p] + "}"
	}
	return fmt.Sprintf("{placeholder %d}", p)
}

// The placeholders each kind of template accepts.
var (
	redirectPlaceholders = []Placeholder{PlaceholderHost, PlaceholderURI, PlaceholderPath, PlaceholderQuery, PlaceholderScheme}
	headerPlaceholders   = []Placeholder{PlaceholderClientIP, PlaceholderRequestID, PlaceholderRoute, PlaceholderHost}
)

// TemplateValues gives a Template the request's values: Append appends the value of p to dst.
// The gateway's per-request state implements it without allocating.
type TemplateValues interface {
	AppendPlaceholder(dst []byte, p Placeholder) []byte
}

// templatePart is a literal, or a placeholder when Var is not 0.
type templatePart struct {
	Literal string
	Var     Placeholder
}

// Template is a value with placeholders, compiled once at load into literal and placeholder
// parts; Append expands it for one request by appending to a buffer, without allocating. "{{"
// writes a literal "{"; a "}" outside a placeholder is literal.
type Template struct {
	raw   string
	parts []templatePart
}

// CompileTemplate compiles s, accepting only the placeholders of allowed. Its error says which
// placeholder is unknown or not allowed, or where a brace is left open.
func CompileTemplate(s string, allowed []Placeholder) (Template, error) {
	t := Template{raw: s}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, templatePart{Literal: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c != '{' {
			lit.WriteByte(c)
			i++
			continue
		}
		if i+1 < len(s) && s[i+1] == '{' {
			lit.WriteByte('{')
			i += 2
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return Template{}, fmt.Errorf("%q: the brace at byte %d is not closed (write {{ for a literal {)", s, i)
		}
		name := s[i+1 : i+end]
		p := lookupPlaceholder(name)
		if p == 0 || !containsPlaceholder(allowed, p) {
			return Template{}, fmt.Errorf("%q: unknown placeholder {%s} (known here: %s; write {{ for a literal {)", s, name, placeholderList(allowed))
		}
		flush()
		t.parts = append(t.parts, templatePart{Var: p})
		i += end + 1
	}
	flush()
	return t, nil
}

func lookupPlaceholder(name string) Placeholder {
	for i, n := range placeholderNames {
		if i > 0 && n == name {
			return Placeholder(i)
		}
	}
	return 0
}

func containsPlaceholder(list []Placeholder, p Placeholder) bool {
	for _, q := range list {
		if q == p {
			return true
		}
	}
	return false
}

func placeholderList(list []Placeholder) string {
	names := make([]string, len(list))
	for i, p := range list {
		names[i] = p.String()
	}
	return strings.Join(names, " ")
}

// Append appends the template expanded with v's values to dst.
func (t *Template) Append(dst []byte, v TemplateValues) []byte {
	for i := range t.parts {
		p := &t.parts[i]
		if p.Var == 0 {
			dst = append(dst, p.Literal...)
		} else {
			dst = v.AppendPlaceholder(dst, p.Var)
		}
	}
	return dst
}

// Literal returns the template's text when it holds no placeholder.
func (t *Template) Literal() (string, bool) {
	for _, p := range t.parts {
		if p.Var != 0 {
			return "", false
		}
	}
	if len(t.parts) == 0 {
		return "", true
	}
	return t.parts[0].Literal, true
}

// Single returns the placeholder when the template is that one placeholder and nothing else
// ("{client_ip}"), so that its value can be used as it is, without expanding into a buffer.
func (t *Template) Single() (Placeholder, bool) {
	if len(t.parts) == 1 && t.parts[0].Var != 0 {
		return t.parts[0].Var, true
	}
	return 0, false
}

// Bind returns the template with every p replaced by the literal value, for a placeholder
// whose value is known at load ({route} of a header rule is the route's name): a template
// left without placeholders is then a Literal. t is unchanged.
func (t *Template) Bind(p Placeholder, value string) Template {
	out := Template{raw: t.raw}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			out.parts = append(out.parts, templatePart{Literal: lit.String()})
			lit.Reset()
		}
	}
	for _, part := range t.parts {
		switch part.Var {
		case 0:
			lit.WriteString(part.Literal)
		case p:
			lit.WriteString(value)
		default:
			flush()
			out.parts = append(out.parts, part)
		}
	}
	flush()
	return out
}

// Uses reports whether the template holds placeholder p.
func (t *Template) Uses(p Placeholder) bool {
	for _, part := range t.parts {
		if part.Var == p {
			return true
		}
	}
	return false
}

// String returns the template as written.
func (t Template) String() string { return t.raw }

// MarshalJSON shows the template as written, for -check.
func (t Template) MarshalJSON() ([]byte, error) { return json.Marshal(t.raw) }

var _ json.Marshaler = Template{}
