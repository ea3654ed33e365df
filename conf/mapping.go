package conf

import (
	"fmt"
	"reflect"
	"strings"
)

// Keys whose value is a mapping of keys of its own (server.proxy_protocol, a route's
// rate_limit). Each struct type carrying koanf tags gets its own kind, numbered from
// kindMapping, with the schema of its fields: the mapping is checked key by key exactly like a
// section (unknown keys, strict types), and its converted values are decoded into the struct by
// the same strict decoder as the rest of the file.
const kindMapping kind = 1 << 10

// mappingSchemas holds the schema of every mapping kind schemaOf met.
var mappingSchemas = map[kind]schema{}

// mappingKind registers struct type t as a mapping kind.
func mappingKind(t reflect.Type) kind {
	k := kindMapping + kind(len(mappingSchemas))
	mappingSchemas[k] = nil // reserve k before the fields, which may register kinds of their own
	mappingSchemas[k] = schemaOf(t)
	return k
}

// describeMapping says what a mapping kind looks like, for error messages.
func describeMapping(sub schema) string {
	return "a mapping with the keys " + strings.Join(sub.keys(), ", ")
}

// fromYAMLMapping checks a YAML mapping against sub and returns its values converted to their
// Go types, keyed as written. The first mistake is returned, prefixed with its key.
func fromYAMLMapping(v any, sub schema) (any, error) {
	m, ok := asMap(v)
	if !ok {
		return nil, fmt.Errorf("must be %s, not %s", describeMapping(sub), yamlLiteral(v))
	}
	out := make(map[string]any, len(m))
	for _, key := range sortedKeys(m) {
		kd, ok := sub[key]
		if !ok {
			return nil, fmt.Errorf("%s: %s", key, sub.unknownKey(key))
		}
		val, err := fromYAML(m[key], kd)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		out[key] = val
	}
	return out, nil
}

// nestedEnvKey resolves an environment key into a mapping key: proxy_protocol__enabled (from
// TORON_SERVER__PROXY_PROTOCOL__ENABLED) is the key enabled of the section server.proxy_protocol
// (SPEC 1: "__" between levels). Any other key is returned as it is.
func nestedEnvKey(section string, sch schema, key string) (string, schema, string) {
	top, rest, ok := strings.Cut(key, "__")
	if !ok {
		return section, sch, key
	}
	sub, ok := mappingSchemas[sch[top]]
	if !ok {
		return section, sch, key
	}
	return section + "." + top, sub, rest
}

// envList splits an environment value into a list: comma-separated, spaces trimmed, empty
// items dropped (TORON_SERVER__TRUSTED_PROXIES="10.0.0.0/8, 192.0.2.7").
func envList(s string) []string {
	out := []string{}
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
