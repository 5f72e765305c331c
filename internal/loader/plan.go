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

// The end of a load. While the queue still holds parts every worker has one in
// flight; once it runs dry the parts still in flight end one after another, and
// the last few come at one connection's rate while the network card idles:
// through make bench-loader's store-shaped link, 2 s for a 16 MiB part. So the
// files that hold the last concurrency x tailPartSize bytes of the queue are
// fetched in smaller parts (see shrinkTail), and what is in flight when the queue
// runs dry is small. The window is no larger because small parts cost requests
// (each a first byte's latency, and the store's work per request).
const (
	tailPartDivisor = 4
	// minTailPartSize keeps a request's first-byte latency (tens of milliseconds
	// at S3) small next to its transfer.
	minTailPartSize = 1 << 20
)

// tailPartSize is the part size of the files queued last: a quarter of partSize,
// not below minTailPartSize nor above partSize.
func tailPartSize(partSize int64) int64 {
	return min(partSize, max(partSize/tailPartDivisor, minTailPartSize))
}

// shrinkTail lays out in parts of tailPartSize the files with a part among the
// last concurrency x tailPartSize bytes of the queue whose part size is free (see
// partSizeIsFree), and returns how many it changed. Files are changed whole: the
// journal keeps one part size per file.
func shrinkTail(tasks []*fileTask, concurrency int, partSize int64) int {
	small := tailPartSize(partSize)
	queue := queueOrder(tasks)
	shrunk := 0
	for i, left := len(queue)-1, int64(concurrency)*small; i >= 0 && left > 0; i-- {
		t := queue[i].t
		left -= queue[i].p.Len
		if t.partSize > small && t.partSizeIsFree() {
			t.setParts(small)
			shrunk++
		}
	}
	return shrunk
}
