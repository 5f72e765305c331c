package manager

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/cache"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestMetricsAuthReusesAndRetriesReviews: scrapes within the answers' TTL send no
// more reviews, and a review the API server could not answer (503) is retried.
// TestSecureMetrics checks the answers themselves against a real API server.
func TestMetricsAuthReusesAndRetriesReviews(t *testing.T) {
	var tokenReviews, accessReviews int
	reviews := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			switch review := obj.(type) {
			case *authenticationv1.TokenReview:
				tokenReviews++
				if tokenReviews == 1 {
					return apierrors.NewServiceUnavailable("etcd is slow")
				}
				review.Status = authenticationv1.TokenReviewStatus{Authenticated: review.Spec.Token == "good", User: authenticationv1.UserInfo{Username: "prometheus"}}
			case *authorizationv1.SubjectAccessReview:
				accessReviews++
				review.Status.Allowed = review.Spec.User == "prometheus" && review.Spec.NonResourceAttributes.Path == "/metrics"
			}
			return nil
		},
	}).Build()
	auth := &metricsAuth{reviews: reviews, tokens: cache.NewLRUExpireCache(8), access: cache.NewLRUExpireCache(8)}
	handler, err := auth.wrap(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) }))
	if err != nil {
		t.Fatal(err)
	}
	scrape := func(header, path string) int {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		return rec.Code
	}
	for i, c := range []struct {
		header, path string
		want         int
	}{
		{"Bearer good", "/metrics", http.StatusOK},
		{"bearer  good ", "/metrics", http.StatusOK},
		{"Bearer good", "/debug", http.StatusForbidden},
		{"Bearer bad", "/metrics", http.StatusUnauthorized},
		{"Basic Z29vZA==", "/metrics", http.StatusUnauthorized},
		{"Bearer ", "/metrics", http.StatusUnauthorized},
	} {
		if got := scrape(c.header, c.path); got != c.want {
			t.Errorf("%d: %q on %s: got %d, want %d", i, c.header, c.path, got, c.want)
		}
	}
	// "good" twice (the first answered 503, then retried) and "bad" once; /metrics
	// and /debug once each.
	if tokenReviews != 3 || accessReviews != 2 {
		t.Errorf("sent %d TokenReviews and %d SubjectAccessReviews, want 3 and 2", tokenReviews, accessReviews)
	}
}
