package limits

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The Redis wire protocol, RESP2 (https://redis.io/docs/latest/develop/reference/protocol-spec/):
// commands are arrays of bulk strings; a decision's reply is an array of two integers, or an
// error line. Only what the limiter sends and reads is here.

// errRedisProtocol is the error of bytes that are not RESP: the connection is closed.
var errRedisProtocol = errors.New("limits: redis sent bytes that are not RESP")

// redisError is an error reply of Redis (-ERR ..., -NOSCRIPT ..., -MOVED ...).
type redisError string

func (e redisError) Error() string { return "limits: redis: " + string(e) }

// prefix reports whether the reply is of the kind p (its first word, as NOSCRIPT or MOVED).
func (e redisError) prefix(p string) bool {
	return len(e) > len(p) && string(e[:len(p)]) == p && e[len(p)] == ' '
}

// appendBulk appends one bulk string.
func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// appendCommand appends the command args.
func appendCommand(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = appendBulk(b, a)
	}
	return b
}

// scriptCmd is EVALSHA sha 1 key args... (or EVAL script 1 key args... when src is the script
// itself), the key given as prefix and suffix so that it is never built as a string.
type scriptCmd struct {
	verb, src string
	keyPrefix string
	keySuffix []byte
	args      []string
}

// append appends the command.
func (c scriptCmd) append(b []byte) []byte {
	verb, src, keyPrefix, keySuffix, args := c.verb, c.src, c.keyPrefix, c.keySuffix, c.args
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(4+len(args)), 10)
	b = append(b, '\r', '\n')
	b = appendBulk(b, verb)
	b = appendBulk(b, src)
	b = append(b, "$1\r\n1\r\n$"...)
	b = strconv.AppendInt(b, int64(len(keyPrefix)+len(keySuffix)), 10)
	b = append(b, '\r', '\n')
	b = append(b, keyPrefix...)
	b = append(b, keySuffix...)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = appendBulk(b, a)
	}
	return b
}

// parseVerdict reads the reply at the start of b: the script's {allowed, wait}, an error reply,
// or another reply (errBadVerdict in the result: ASKING's +OK, dropped). n is 0 when b holds no
// complete reply yet; err is set only for bytes that are not RESP.
func parseVerdict(b []byte) (r verdictReply, n int, err error) {
	if len(b) == 0 {
		return r, 0, nil
	}
	if b[0] == '-' {
		line, n := respLine(b)
		if n == 0 {
			return r, 0, nil
		}
		return verdictReply{err: redisError(line[1:])}, n, nil
	}
	// The verdict: *2 :A :W, read in place.
	if len(b) > 4 && b[0] == '*' && b[1] == '2' && b[2] == '\r' && b[3] == '\n' {
		a, n1, ok1 := respInt(b[4:])
		if n1 == 0 {
			return r, 0, nil
		}
		if ok1 {
			w, n2, ok2 := respInt(b[4+n1:])
			if n2 == 0 {
				return r, 0, nil
			}
			if ok2 {
				return verdictReply{ok: a == 1, wait: w}, 4 + n1 + n2, nil
			}
		}
	}
	n, err = skipValue(b, 0)
	if n == 0 || err != nil {
		return r, 0, err
	}
	return verdictReply{err: errBadVerdict}, n, nil
}

// respLine returns the line at the start of b without its CRLF, and its length with it; 0 when
// the line is not complete.
func respLine(b []byte) ([]byte, int) {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return nil, 0
	}
	return b[:i-1], i + 1
}

// respInt reads an integer reply :N at the start of b; ok is false when it is another reply.
func respInt(b []byte) (v int64, n int, ok bool) {
	if len(b) > 0 && b[0] != ':' {
		return 0, -1, false
	}
	line, n := respLine(b)
	if n == 0 {
		return 0, 0, false
	}
	v, err := strconv.ParseInt(string(line[1:]), 10, 64)
	return v, n, err == nil
}

// skipValue returns the length of the complete RESP value at the start of b, 0 when it is not
// complete yet.
func skipValue(b []byte, depth int) (int, error) {
	if depth > 8 {
		return 0, errRedisProtocol
	}
	line, n := respLine(b)
	if n == 0 {
		if len(b) > 64<<10 {
			return 0, errRedisProtocol
		}
		return 0, nil
	}
	if len(line) == 0 {
		return 0, errRedisProtocol
	}
	switch line[0] {
	case '+', '-', ':':
		return n, nil
	case '$':
		l, err := strconv.Atoi(string(line[1:]))
		if err != nil || l < -1 {
			return 0, errRedisProtocol
		}
		if l == -1 {
			return n, nil
		}
		if len(b) < n+l+2 {
			return 0, nil
		}
		return n + l + 2, nil
	case '*':
		c, err := strconv.Atoi(string(line[1:]))
		if err != nil || c < -1 {
			return 0, errRedisProtocol
		}
		for i := 0; i < c; i++ {
			m, err := skipValue(b[n:], depth+1)
			if m == 0 || err != nil {
				return 0, err
			}
			n += m
		}
		return n, nil
	}
	return 0, errRedisProtocol
}

// respValue is a reply read whole, for the commands of a connection's set-up and of the
// cluster's map (never on a decision's path).
type respValue struct {
	kind byte // '+', '-', ':', '$', '*'
	str  string
	num  int64
	arr  []respValue
	null bool
}

// err returns the reply's error, when it is one.
func (v respValue) err() error {
	if v.kind == '-' {
		return redisError(v.str)
	}
	return nil
}

// readValue reads one reply from br.
func readValue(br *bufio.Reader, depth int) (respValue, error) {
	if depth > 8 {
		return respValue{}, errRedisProtocol
	}
	line, err := br.ReadSlice('\n')
	if err != nil {
		return respValue{}, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return respValue{}, errRedisProtocol
	}
	v := respValue{kind: line[0]}
	body := string(line[1 : len(line)-2])
	switch v.kind {
	case '+', '-':
		v.str = body
	case ':':
		if v.num, err = strconv.ParseInt(body, 10, 64); err != nil {
			return v, errRedisProtocol
		}
	case '$':
		l, err := respCount(body, 512<<20)
		if err != nil || l < 0 {
			v.null = l < 0
			return v, err
		}
		buf := make([]byte, l+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return v, err
		}
		v.str = string(buf[:l])
	case '*':
		c, err := respCount(body, 1<<20)
		if err != nil || c < 0 {
			v.null = c < 0
			return v, err
		}
		v.arr = make([]respValue, c)
		for i := range v.arr {
			if v.arr[i], err = readValue(br, depth+1); err != nil {
				return v, err
			}
		}
	default:
		return v, fmt.Errorf("%w (a reply starting %q)", errRedisProtocol, line[0])
	}
	return v, nil
}

// respCount reads the length of a bulk string or an array, -1 for a null one, at most most.
func respCount(body string, most int) (int, error) {
	n, err := strconv.Atoi(body)
	if err != nil || n < -1 || n > most {
		return 0, errRedisProtocol
	}
	return n, nil
}
