package manager

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// How long the API server's answers are reused, as controller-runtime's
// filters.WithAuthenticationAndAuthorization does: a scrape every 15-30 s costs
// a TokenReview a minute and a SubjectAccessReview every five.
const (
	tokenReviewTTL  = time.Minute
	accessAllowTTL  = 5 * time.Minute
	accessDenyTTL   = 30 * time.Second
	reviewTimeout   = 10 * time.Second
	reviewCacheSize = 1024
)

// reviewBackoff retries a review the API server could not answer (a timeout, a
// 429 or a 5xx) 5 times over about 4 s.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// metricsAuth lets a scrape through only when the API server authenticates its
// bearer token (TokenReview) and authorizes that user for the request's verb on
// its non-resource path (SubjectAccessReview). It is what controller-runtime's
// filters.WithAuthenticationAndAuthorization does, written against the API types
// alone: that filter links k8s.io/apiserver, and with it CEL, gRPC and
// konnectivity, which cost the operator 3 MiB of resident memory by themselves and
// kept gRPC in the binary (12 MiB more with the trace exporter's; docs/performance.md).
type metricsAuth struct {
	reviews client.Client
	tokens  *cache.LRUExpireCache // sha256 of a token -> *authenticationv1.UserInfo, nil when refused
	access  *cache.LRUExpireCache // accessKey -> bool
}

// metricsAuthFilter is the metrics server's FilterProvider for --metrics-secure.
func metricsAuthFilter(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	reviews, err := client.New(cfg, client.Options{HTTPClient: httpClient, Scheme: clientgoscheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the client for token and access reviews: %w", err)
	}
	auth := &metricsAuth{reviews: reviews, tokens: cache.NewLRUExpireCache(reviewCacheSize), access: cache.NewLRUExpireCache(reviewCacheSize)}
	return auth.wrap, nil
}

func (a *metricsAuth) wrap(log logr.Logger, next http.Handler) (http.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		token, ok := bearerToken(req)
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		user, err := a.authenticate(req.Context(), token)
		if err != nil {
			log.Error(err, "Authentication failed")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		if user == nil {
			log.V(4).Info("Authentication failed")
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(req.Method)
		allowed, err := a.authorize(req.Context(), user, verb, req.URL.Path)
		if err != nil {
			msg := fmt.Sprintf("Authorization for user %s failed", user.Username)
			log.Error(err, msg)
			http.Error(w, msg, http.StatusInternalServerError)
			return
		}
		if !allowed {
			msg := fmt.Sprintf("Authorization denied for user %s", user.Username)
			log.V(4).Info(msg, "verb", verb, "path", req.URL.Path)
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, req)
	}), nil
}

// bearerToken is the token of an "Authorization: Bearer" header.
func bearerToken(req *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(req.Header.Get("Authorization")), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "bearer") && token != ""
}

// authenticate returns the token's user, or nil when the API server does not
// authenticate it; an error only when it could not say.
func (a *metricsAuth) authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, error) {
	key := sha256.Sum256([]byte(token))
	if cached, ok := a.tokens.Get(key); ok {
		return cached.(*authenticationv1.UserInfo), nil
	}
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if err := a.create(ctx, review); err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	var user *authenticationv1.UserInfo
	if review.Status.Authenticated {
		user = &review.Status.User
	}
	a.tokens.Add(key, user, tokenReviewTTL)
	return user, nil
}

// accessKey is one user's request for one verb on one path.
type accessKey struct{ user, verb, path string }

// authorize asks whether the user may use the verb on the non-resource path.
func (a *metricsAuth) authorize(ctx context.Context, user *authenticationv1.UserInfo, verb, path string) (bool, error) {
	key := accessKey{user: fmt.Sprintf("%s\x00%s\x00%v\x00%v", user.Username, user.UID, user.Groups, user.Extra), verb: verb, path: path}
	if cached, ok := a.access.Get(key); ok {
		return cached.(bool), nil
	}
	extra := make(map[string]authorizationv1.ExtraValue, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	}}
	if err := a.create(ctx, review); err != nil {
		return false, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	allowed := review.Status.Allowed && !review.Status.Denied
	ttl := accessDenyTTL
	if allowed {
		ttl = accessAllowTTL
	}
	a.access.Add(key, allowed, ttl)
	return allowed, nil
}

// create sends a review, retrying what the API server could not answer.
func (a *metricsAuth) create(ctx context.Context, review client.Object) error {
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	return retry.OnError(reviewBackoff, transientReviewError, func() error { return a.reviews.Create(ctx, review) })
}

func transientReviewError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == http.StatusTooManyRequests || code >= http.StatusInternalServerError
	}
	return true // not an answer from the API server: the connection failed
}
