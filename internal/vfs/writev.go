package vfs

import "io"

// VecWriterAt is implemented by files that write a gather list at an offset in one system
// call (pwritev on Linux). WriteVecAt uses it when a file has it.
type VecWriterAt interface {
	// WriteVecAt writes the concatenation of bufs at off and returns the bytes written; a
	// count short of the total comes with an error. It does not retain bufs.
	WriteVecAt(bufs [][]byte, off int64) (int, error)
}

// WriteVecAt writes the concatenation of bufs at off: in one call where f implements
// VecWriterAt, else with one WriteAt per non-empty buffer, in order (a crash between them
// leaves a prefix, as a torn pwritev may). It returns the bytes written; a count short of
// the total comes with an error (io.ErrShortWrite if the file gave none). It does not retain
// bufs.
func WriteVecAt(f File, bufs [][]byte, off int64) (int, error) {
	if v, ok := f.(VecWriterAt); ok {
		return v.WriteVecAt(bufs, off)
	}
	total := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		n, err := f.WriteAt(b, off+int64(total))
		total += n
		if err == nil && n != len(b) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
