package loader

// part is one ranged request of a file: bytes [Off, Off+Len).
type part struct {
	Index int
	Off   int64
	Len   int64
}

// planParts splits a file of size bytes into parts of partSize bytes, the last one
// shorter when partSize does not divide size. An empty file has no parts.
func planParts(size, partSize int64) []part {
	if size <= 0 {
		return nil
	}
	if partSize <= 0 || partSize > size {
		partSize = size
	}
	n := int((size + partSize - 1) / partSize)
	parts := make([]part, n)
	for i := range parts {
		off := int64(i) * partSize
		parts[i] = part{Index: i, Off: off, Len: min(partSize, size-off)}
	}
	return parts
}

// alignedPartSize picks the download part size for an object uploaded in parts of
// uploadPart bytes: the whole multiple of uploadPart nearest to want (at least one).
// Aligned parts let the loader hash each upload part while it streams, and so check
// a multipart ETag without reading the file a second time.
func alignedPartSize(want, uploadPart int64) int64 {
	if uploadPart <= 0 {
		return want
	}
	k := (want + uploadPart/2) / uploadPart
	if k < 1 {
		k = 1
	}
	return k * uploadPart
}
