package loader

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awscreds "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/aiinference/operator/internal/loadspec"
)

// s3Source reads a model from an S3-compatible store with the AWS SDK. The SDK's own
// retries are off: the loader retries each request itself (with back-off, jitter
// and a stall watchdog), so that one policy governs every source.
type s3Source struct {
	client *s3.Client
	bucket string
	prefix string
	retry  retryPolicy
	// checkMultipart, storeChecksums: see Options.
	checkMultipart, storeChecksums bool
	// describeConcurrency bounds the HEAD requests of describe.
	describeConcurrency int
}

// newHTTPTransport is the transport of every network source: enough idle
// connections for the whole concurrency, no transparent decompression (the bytes
// must be the object's), and timeouts on each step before the body.
func newHTTPTransport(concurrency int, stall time.Duration) *http.Transport {
	tr := &http.Transport{}
	tuneTransport(tr, concurrency, stall)
	return tr
}

func tuneTransport(tr *http.Transport, concurrency int, stall time.Duration) {
	tr.Proxy = http.ProxyFromEnvironment
	tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.MaxIdleConns = 2 * concurrency
	tr.MaxIdleConnsPerHost = 2 * concurrency
	tr.IdleConnTimeout = 90 * time.Second
	tr.TLSHandshakeTimeout = 30 * time.Second
	tr.ResponseHeaderTimeout = stall
	tr.ExpectContinueTimeout = time.Second
	tr.DisableCompression = true
	// Below bufSize, so that body reads go straight into the loader's buffer
	// instead of through one more copy in the connection's bufio.Reader.
	tr.ReadBufferSize = 64 << 10
	tr.WriteBufferSize = 64 << 10
}

func newS3Source(ctx context.Context, su sourceURL, o Options, c credentials) (*s3Source, error) {
	region := o.S3.Region
	loadOpts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
		// A buildable client, so that AWS_CA_BUNDLE and the like still apply.
		awsconfig.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
			tuneTransport(tr, o.Concurrency, o.StallTimeout.Duration)
		})),
		// The loader verifies content itself (ETag, multipart ETag, sha256 manifest);
		// the SDK's whole-object response checksums do not apply to ranged reads.
		awsconfig.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		awsconfig.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if region != "" {
		loadOpts = append(loadOpts, awsconfig.WithRegion(region))
	}
	switch {
	case o.Anonymous:
		// Not even the default chain: the pod's keys are the model's store's.
		loadOpts = append(loadOpts, awsconfig.WithCredentialsProvider(aws.AnonymousCredentials{}))
	case c.AccessKeyID != "":
		loadOpts = append(loadOpts, awsconfig.WithCredentialsProvider(
			awscreds.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken)))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "S3 configuration: %v", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.S3.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.S3.Endpoint)
		}
		so.UsePathStyle = o.S3.PathStyle
		so.DisableLogOutputChecksumValidationSkipped = true
	})
	return &s3Source{client: client, bucket: su.Bucket, prefix: su.Prefix, retry: defaultRetry,
		checkMultipart: o.CheckMultipartETag, storeChecksums: o.StoreChecksums, describeConcurrency: o.Concurrency}, nil
}

func (s *s3Source) List(ctx context.Context) ([]Object, error) {
	prefix := s.prefix
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	var objs []Object
	var token *string
	for {
		var out *s3.ListObjectsV2Output
		err := s.retry.do(ctx, func(ctx context.Context) error {
			var err error
			out, err = s.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{
				Bucket: &s.bucket, Prefix: &prefix, ContinuationToken: token,
			})
			return err
		}, nil)
		if err != nil {
			return nil, fmt.Errorf("listing s3://%s/%s: %w", s.bucket, prefix, err)
		}
		for _, it := range out.Contents {
			key := aws.ToString(it.Key)
			if strings.HasSuffix(key, "/") {
				continue // a folder marker
			}
			objs = append(objs, Object{
				Key: key, Path: strings.TrimPrefix(key, prefix),
				Size: aws.ToInt64(it.Size), ETag: strings.Trim(aws.ToString(it.ETag), `"`),
			})
		}
		if !aws.ToBool(out.IsTruncated) || out.NextContinuationToken == nil {
			break
		}
		token = out.NextContinuationToken
	}
	if len(objs) == 0 && s.prefix != "" && !strings.HasSuffix(s.prefix, "/") {
		// The prefix may name a single object.
		obj, err := s.head(ctx, s.prefix)
		if err != nil {
			if le, ok := err.(*Error); !ok || le.Reason != loadspec.ReasonNotFound {
				return nil, err
			}
		} else {
			obj.Path = s.prefix[strings.LastIndexByte(s.prefix, '/')+1:]
			objs = append(objs, obj)
		}
	}
	if len(objs) == 0 {
		return nil, failf(loadspec.ReasonNotFound, "", "no objects under s3://%s/%s", s.bucket, s.prefix)
	}
	if err := s.describe(ctx, objs); err != nil {
		return nil, err
	}
	return objs, nil
}

func (s *s3Source) head(ctx context.Context, key string) (Object, error) {
	var out *s3.HeadObjectOutput
	err := s.retry.do(ctx, func(ctx context.Context) error {
		var err error
		out, err = s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &key})
		return err
	}, nil)
	if err != nil {
		return Object{}, err
	}
	return Object{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: strings.Trim(aws.ToString(out.ETag), `"`)}, nil
}

// describe fills in what vouches for each object's content: the checksum the store
// keeps (a HEAD in checksum mode), the MD5 of a single-part upload, and for a
// multipart upload checked part by part (composite checksum or multipart ETag)
// the part layout, from a HEAD of its first part.
func (s *s3Source) describe(ctx context.Context, objs []Object) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(s.describeConcurrency, 1))
	for i := range objs {
		o := &objs[i]
		if isHexMD5(o.ETag) {
			o.MD5 = strings.ToLower(o.ETag)
		}
		parts, multipart := multipartETag(o.ETag)
		if o.Size == 0 || (!s.storeChecksums && !(multipart && s.checkMultipart)) {
			continue
		}
		g.Go(func() error {
			if s.storeChecksums {
				out, err := s.headForDescribe(gctx, o, nil)
				if err != nil {
					return err
				}
				if out != nil {
					o.Checksum = storeChecksumOf(out)
				}
			}
			byUploadPart := o.Checksum != nil && o.Checksum.Parts > 0 || o.Checksum == nil && s.checkMultipart
			if !multipart || !byUploadPart {
				return nil
			}
			out, err := s.headForDescribe(gctx, o, aws.Int32(1))
			if err != nil || out == nil {
				return err
			}
			first := aws.ToInt64(out.ContentLength)
			// Every common uploader uses equal parts but the last; check that the
			// layout adds up before relying on it.
			if first > 0 && int((o.Size+first-1)/first) == parts && (out.PartsCount == nil || int(*out.PartsCount) == parts) {
				o.UploadPartSize, o.UploadParts = first, parts
			}
			return nil
		})
	}
	return g.Wait()
}

// headForDescribe HEADs the listed version of o (or one of its upload parts) in
// checksum mode. A store that cannot answer leaves the object less checked (nil,
// nil); a missing object or a refusal is an error.
func (s *s3Source) headForDescribe(ctx context.Context, o *Object, partNumber *int32) (*s3.HeadObjectOutput, error) {
	var out *s3.HeadObjectOutput
	err := s.retry.do(ctx, func(ctx context.Context) error {
		var err error
		out, err = s.client.HeadObject(ctx, &s3.HeadObjectInput{
			Bucket: &s.bucket, Key: &o.Key, PartNumber: partNumber, IfMatch: aws.String(`"` + o.ETag + `"`),
			ChecksumMode: types.ChecksumModeEnabled,
		})
		return err
	}, nil)
	if err != nil {
		if le, ok := err.(*Error); ok && (le.Reason == loadspec.ReasonNotFound || le.Reason == loadspec.ReasonAccessDenied) {
			return nil, fmt.Errorf("%s: %w", o.Path, err)
		}
		return nil, nil
	}
	return out, nil
}

// storeChecksumOf picks the cheapest checksum to check among those a HEAD returned.
func storeChecksumOf(out *s3.HeadObjectOutput) *StoreChecksum {
	var best *StoreChecksum
	for alg, value := range map[string]*string{
		"CRC64NVME": out.ChecksumCRC64NVME, "CRC32C": out.ChecksumCRC32C, "CRC32": out.ChecksumCRC32,
		"SHA256": out.ChecksumSHA256, "SHA1": out.ChecksumSHA1,
	} {
		sc, ok := parseStoreChecksum(alg, aws.ToString(value))
		if !ok {
			continue
		}
		// A composite checksum may come without its part count in the value.
		if sc.Parts == 0 && out.ChecksumType == types.ChecksumTypeComposite {
			continue
		}
		best = cheaper(best, sc)
	}
	return best
}

func (s *s3Source) Fetch(ctx context.Context, obj *Object, off, n int64) (io.ReadCloser, error) {
	in := &s3.GetObjectInput{
		Bucket: &s.bucket, Key: &obj.Key,
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1)),
	}
	if obj.ETag != "" {
		in.IfMatch = aws.String(`"` + obj.ETag + `"`)
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, err
	}
	if out.ContentLength != nil && *out.ContentLength != n {
		out.Body.Close()
		return nil, fmt.Errorf("asked for %d bytes at %d, the store answers %d", n, off, *out.ContentLength)
	}
	return out.Body, nil
}
