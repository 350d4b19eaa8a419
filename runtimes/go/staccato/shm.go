package staccato

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"

	"staccato.local/go/wire"
)

// Shared-memory payload files (docs/protocol.md, "Shared-memory payload
// files"): $DIR/shm/<call id as 16 lowercase hex digits>.<i|o>. The sender
// writes the whole file before the message that names it; the receiver
// reads it and unlinks it.

// shmPath is the payload file in dir of a kind message about callID.
func shmPath(dir string, callID uint64, kind wire.Kind) string {
	suffix := byte('o') // Completion and Failure
	if kind == wire.Dispatch || kind == wire.Invoke {
		suffix = 'i'
	}
	b := make([]byte, 0, len(dir)+19)
	b = append(b, dir...)
	b = append(b, '/')
	hex := strconv.AppendUint(make([]byte, 0, 16), callID, 16)
	for i := len(hex); i < 16; i++ {
		b = append(b, '0')
	}
	b = append(b, hex...)
	b = append(b, '.', suffix)
	return string(b)
}

// writeShm creates the payload file (mode 0600) with all of data. On error
// nothing is left behind.
func writeShm(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// readShm reads a payload file of exactly size bytes and unlinks it (the
// receiver owns it), also when it cannot be read.
func readShm(path string, size uint32) ([]byte, error) {
	defer syscall.Unlink(path)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != int64(size) {
		return nil, fmt.Errorf("shm payload %s is %d bytes, expected %d", path, st.Size(), size)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, nil
}
