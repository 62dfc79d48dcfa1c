package server

import (
	"path/filepath"
	"regexp"
	"strings"
)

// The error texts the server tells clients and probes, without the machine's paths.

// absPath matches an absolute path in an error text: a "/" at the start or after a space,
// quote, parenthesis or "=", up to the next space, quote, colon, comma or parenthesis.
var absPath = regexp.MustCompile(`(^|[\s"'(=])(/[^\s"':,()]+)`)

// PublicText is err's text as the server tells clients and probes: paths inside the data
// directory relative to it, other absolute paths cut to their last element (an error of the
// engine names its files; /healthz may be served beyond loopback).
func (s *Server) PublicText(err error) string { return s.scrubPaths(err.Error()) }

// scrubPaths removes the machine's paths from an error text sent to a client: paths in the
// data directory become relative to it, any other absolute path becomes its last element.
// The server's own log keeps the full text.
func (s *Server) scrubPaths(msg string) string {
	if !strings.Contains(msg, "/") {
		return msg
	}
	if dir := s.dataDir(); dir != "" {
		msg = strings.ReplaceAll(msg, dir+string(filepath.Separator), "")
		msg = strings.ReplaceAll(msg, dir, ".")
	}
	return absPath.ReplaceAllStringFunc(msg, func(m string) string {
		i := strings.IndexByte(m, '/')
		return m[:i] + filepath.Base(m[i:])
	})
}

// dataDir reports the engine's directory, absolute, or "".
func (s *Server) dataDir() string {
	if s.eng == nil || s.eng.Dir() == "" {
		return ""
	}
	if abs, err := filepath.Abs(s.eng.Dir()); err == nil {
		return abs
	}
	return s.eng.Dir()
}
