package loader

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"strconv"
	"strings"

	"github.com/minio/crc64nvme"
)

// Names of the checks, as the summary counts them and the marker records them.
const (
	checkSHA256    = "sha256"        // the sha256 manifest
	checkMD5       = "md5"           // a single-part S3 ETag
	checkMultipart = "multipartETag" // a multipart S3 ETag, checked upload part by upload part
	checkSize      = "size"          // nothing but the size
	checkGitBlob   = "gitBlobSHA1"   // a git blob id (the Hub's id of a file kept in git, not LFS)
	// A store checksum is named after its algorithm ("crc64nvme", "sha1"), with
	// "-composite" for a checksum of the upload parts' checksums.
	compositeSuffix = "-composite"
)

// checkKind is how a check's digest is computed while parts arrive in any order.
type checkKind int

const (
	// kindSize: nothing to compute.
	kindSize checkKind = iota
	// kindWhole: one hash over the file front to back (streamed for a single part,
	// otherwise read back as the finished prefix grows; see seqHasher).
	kindWhole
	// kindCRC: a CRC per download part, combined at the end; no byte is read twice.
	kindCRC
	// kindUploadParts: a digest per upload part of an S3 multipart upload, then a
	// digest of the digests (multipart ETags, composite store checksums).
	kindUploadParts
)

// check is what one file is verified against.
type check struct {
	name    string
	kind    checkKind
	newHash func() hash.Hash
	// want is the expected digest: of the content (kindWhole, kindCRC), or of the
	// concatenated upload parts' digests (kindUploadParts).
	want []byte
	// uploadParts is the number of upload parts the digest covers (kindUploadParts).
	uploadParts int
	// crc is the CRC's parameters (kindCRC).
	crc crcParams
}

// StoreChecksum is a store's own checksum of an object (S3 additional checksums).
type StoreChecksum struct {
	// Algorithm as S3 names it: CRC64NVME, CRC32C, CRC32, SHA256 or SHA1.
	Algorithm string
	// Sum is the digest: of the content, or of the upload parts' digests when
	// Parts > 0 (a composite checksum, "BASE64-N").
	Sum   []byte
	Parts int
}

// parseStoreChecksum reads an S3 checksum header value ("BASE64" or "BASE64-N").
func parseStoreChecksum(algorithm, value string) (*StoreChecksum, bool) {
	if _, ok := storeAlgorithms[algorithm]; !ok || value == "" {
		return nil, false
	}
	parts := 0
	if i := strings.LastIndexByte(value, '-'); i >= 0 {
		n, err := strconv.Atoi(value[i+1:])
		if err != nil || n <= 0 {
			return nil, false
		}
		value, parts = value[:i], n
	}
	sum, err := base64.StdEncoding.DecodeString(value)
	if err != nil || len(sum) != storeAlgorithms[algorithm].size {
		return nil, false
	}
	return &StoreChecksum{Algorithm: algorithm, Sum: sum, Parts: parts}, true
}

// cheaper returns whichever of two store checksums (either may be nil) costs less
// to check.
func cheaper(a, b *StoreChecksum) *StoreChecksum {
	if a == nil || b != nil && storeAlgorithms[b.Algorithm].rank < storeAlgorithms[a.Algorithm].rank {
		return b
	}
	return a
}

// storeAlgorithms are the S3 checksum algorithms the loader can check, cheapest
// first: a store that keeps several is checked with the first.
var storeAlgorithms = map[string]struct {
	rank, size int
	newHash    func() hash.Hash
	crc        crcParams
}{
	"CRC64NVME": {0, 8, func() hash.Hash { return crc64nvme.New() }, crcParams{width: 64, poly: 0x9a6c9329ac4bc9b5}},
	"CRC32C":    {1, 4, func() hash.Hash { return crc32.New(crc32.MakeTable(crc32.Castagnoli)) }, crcParams{width: 32, poly: 0x82f63b78}},
	"CRC32":     {2, 4, func() hash.Hash { return crc32.NewIEEE() }, crcParams{width: 32, poly: 0xedb88320}},
	"SHA256":    {3, sha256.Size, sha256.New, crcParams{}},
	"SHA1":      {4, sha1.Size, sha1.New, crcParams{}},
}

// checkFor picks the strongest check the source offers for obj that is cheap
// enough to run: the sha256 manifest, a full-object store checksum, a single-part
// ETag's MD5, a composite store checksum, a multipart ETag, else the size.
func checkFor(obj *Object) check {
	if sum, err := hex.DecodeString(obj.SHA256); err == nil && len(sum) == sha256.Size {
		return check{name: checkSHA256, kind: kindWhole, newHash: sha256.New, want: sum}
	}
	if sum, err := hex.DecodeString(obj.GitBlobSHA1); err == nil && len(sum) == sha1.Size {
		size := obj.Size
		return check{name: checkGitBlob, kind: kindWhole, want: sum, newHash: func() hash.Hash {
			h := sha1.New()
			fmt.Fprintf(h, "blob %d\x00", size)
			return h
		}}
	}
	sc := obj.Checksum
	if sc != nil && sc.Parts == 0 {
		alg := storeAlgorithms[sc.Algorithm]
		c := check{name: strings.ToLower(sc.Algorithm), kind: kindWhole, newHash: alg.newHash, want: sc.Sum}
		if alg.crc.width > 0 {
			c.kind, c.crc = kindCRC, alg.crc
		}
		return c
	}
	if sum, err := hex.DecodeString(obj.MD5); err == nil && len(sum) == md5.Size {
		return check{name: checkMD5, kind: kindWhole, newHash: md5.New, want: sum}
	}
	if obj.UploadPartSize > 0 {
		if sc != nil && sc.Parts == obj.UploadParts {
			return check{name: strings.ToLower(sc.Algorithm) + compositeSuffix, kind: kindUploadParts,
				newHash: storeAlgorithms[sc.Algorithm].newHash, want: sc.Sum, uploadParts: sc.Parts}
		}
		if n, ok := multipartETag(obj.ETag); ok && n == obj.UploadParts {
			if sum, err := hex.DecodeString(obj.ETag[:strings.LastIndexByte(obj.ETag, '-')]); err == nil && len(sum) == md5.Size {
				return check{name: checkMultipart, kind: kindUploadParts, newHash: md5.New, want: sum, uploadParts: n}
			}
		}
	}
	return check{name: checkSize, kind: kindSize}
}

// mismatch compares the digest the downloaded bytes give with the expected one,
// and describes a difference ("" when they agree).
func (c check) mismatch(got []byte, uploadParts int) string {
	if c.kind == kindUploadParts && uploadParts != c.uploadParts {
		return fmt.Sprintf("the source says %d upload parts, the download has %d", c.uploadParts, uploadParts)
	}
	if bytes.Equal(got, c.want) {
		return ""
	}
	show := hex.EncodeToString
	if c.name != checkSHA256 && c.name != checkMD5 && c.name != checkMultipart && c.name != checkGitBlob {
		show = base64.StdEncoding.EncodeToString // as S3 shows its checksums
	}
	return fmt.Sprintf("the source says %s %s, the downloaded bytes give %s", c.name, show(c.want), show(got))
}

// crcParams describe a reflected CRC with all-ones initial value and final xor
// (CRC-32, CRC-32C, CRC-64/NVME), which is what crcCombine needs.
type crcParams struct {
	width int
	poly  uint64 // reflected polynomial
}

// crcValue reads a CRC from its big-endian digest bytes.
func (p crcParams) crcValue(sum []byte) uint64 {
	if p.width == 32 {
		return uint64(binary.BigEndian.Uint32(sum))
	}
	return binary.BigEndian.Uint64(sum)
}

func (p crcParams) digest(crc uint64) []byte {
	if p.width == 32 {
		return binary.BigEndian.AppendUint32(nil, uint32(crc))
	}
	return binary.BigEndian.AppendUint64(nil, crc)
}

// combine returns the CRC of A followed by B from crc(A), crc(B) and len(B): crc(A)
// times x^(8·len(B)) modulo the polynomial, plus crc(B) (zlib's crc32_combine, in
// any width). It lets parts fetched in parallel each keep their own CRC.
func (p crcParams) combine(crcA, crcB uint64, lenB int64) uint64 {
	return p.mulmod(p.xpow8n(lenB), crcA) ^ crcB
}

// mulmod multiplies a and b modulo the polynomial, in the reflected bit order
// (the top bit is x^0).
func (p crcParams) mulmod(a, b uint64) uint64 {
	top := uint64(1) << (p.width - 1)
	var prod uint64
	for m := top; m != 0; m >>= 1 {
		if a&m != 0 {
			prod ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ p.poly
		} else {
			b >>= 1
		}
	}
	return prod
}

// xpow8n returns x^(8n) modulo the polynomial, by squaring.
func (p crcParams) xpow8n(n int64) uint64 {
	top := uint64(1) << (p.width - 1)
	result, sq := top, top>>8 // x^0 and x^8
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			result = p.mulmod(result, sq)
		}
		sq = p.mulmod(sq, sq)
	}
	return result
}
