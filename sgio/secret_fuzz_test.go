package sgio

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseSecret: any bytes (a secret file's contents) give a key of at least SecretBytesMin
// bytes, no key and no error (empty), or ErrWeakSecret; never a panic.
func FuzzParseSecret(f *testing.F) {
	for _, s := range []string{"", " \n", "topsecret-123", "8f1c2be04d6a39e7a5b2c47d10fe6e93", "jxwr4E1qOeelssR9EP5ukw==",
		"jxwr4E1qOeelssR9EP5ukw", "00000000000000000000000000000000", GenerateSecret()} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		key, err := ParseSecret(text)
		switch {
		case err != nil:
			if !errors.Is(err, ErrWeakSecret) {
				t.Fatalf("error %v is not ErrWeakSecret", err)
			}
		case key == nil:
			if len(bytes.TrimSpace(text)) != 0 {
				t.Fatalf("no key for %q", text)
			}
		case len(key) < SecretBytesMin:
			t.Fatalf("key of %d bytes", len(key))
		}
	})
}
