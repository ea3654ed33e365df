package conf

import (
	"fmt"
	"strings"
)

// EnvironmentSource is the Error.File of a mistake in a TORON_SERVER__* or TORON_LOG__*
// variable; the variable's name is then the Error.Key.
const EnvironmentSource = "environment"

// Error is one configuration mistake. It names where the operator must look, in the shape
// "routes.yaml: routes[3] (/legacy): max_body_bytes: must not be negative" (STYLE 6). Load
// returns every Error it found joined with errors.Join; use errors.As to get one.
type Error struct {
	// File is the file name as given to Load or LoadBytes, or EnvironmentSource.
	File string
	// Route is the 0-based index in routes.yaml of the route at fault, -1 when none.
	Route int
	// Prefix is the route's prefix as written, "" when it has none.
	Prefix string
	// Key is the key at fault: "server.read_timeout", a route key such as "max_body_bytes",
	// or an environment variable name; "" for a whole-file error.
	Key string
	// Msg says what is wrong and, where it helps, what to write instead.
	Msg string
	// Err is the underlying cause (a file system or YAML error), nil when there is none.
	Err error
}

// Error returns the mistake in the shape "file: routes[i] (prefix): key: msg", leaving out
// the parts that are empty.
func (e *Error) Error() string {
	parts := make([]string, 0, 5)
	if e.File != "" {
		parts = append(parts, e.File)
	}
	if e.Route >= 0 {
		if e.Prefix != "" {
			parts = append(parts, fmt.Sprintf("routes[%d] (%s)", e.Route, e.Prefix))
		} else {
			parts = append(parts, fmt.Sprintf("routes[%d]", e.Route))
		}
	}
	if e.Key != "" {
		parts = append(parts, e.Key)
	}
	msg := e.Msg
	if e.Err != nil {
		if msg == "" {
			msg = e.Err.Error()
		} else {
			msg += ": " + e.Err.Error()
		}
	}
	parts = append(parts, msg)
	return strings.Join(parts, ": ")
}

// Unwrap returns the underlying cause, so errors.Is(err, fs.ErrNotExist) works on a
// missing file.
func (e *Error) Unwrap() error { return e.Err }

// errorList collects Errors in the order they are found.
type errorList []error

// add records one mistake.
func (l *errorList) add(file string, route int, prefix, key, format string, args ...any) {
	*l = append(*l, &Error{File: file, Route: route, Prefix: prefix, Key: key, Msg: fmt.Sprintf(format, args...)})
}

var _ error = (*Error)(nil)
