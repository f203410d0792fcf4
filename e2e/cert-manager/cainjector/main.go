// cainjector writes CA certificates into webhook configurations for the e2e tests, as a host
// process against the test apiserver: a ValidatingWebhookConfiguration or
// MutatingWebhookConfiguration annotated
//
//	cert-manager.io/inject-ca-from: <namespace>/<certificate>
//
// gets the ca.crt of that Certificate's Secret as the caBundle of each of its webhooks, and again
// whenever the Secret changes. (cert-manager.io/inject-ca-from-secret: <namespace>/<secret> takes
// a Secret annotated cert-manager.io/allow-direct-injection: "true" instead.)
//
// It is this project's own small program: cert-manager's exported injector on a
// controller-runtime manager, with no leader election and no metrics or health server. The
// cert-manager CRDs must be in place before it starts.
//
//	cainjector --kubeconfig FILE [-v 4]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	"github.com/cert-manager/cert-manager/pkg/util"
)

func main() {
	// controller-runtime defines --kubeconfig itself, falling back to $KUBECONFIG.
	klog.InitFlags(nil) // -v N: 4 and up for debugging detail
	flag.Parse()
	ctrl.SetLogger(klog.NewKlogr())

	if err := run(ctrl.SetupSignalHandler()); err != nil {
		klog.ErrorS(err, "cainjector failed")
		klog.Flush()
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	config, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	// The injector names its server-side-apply field manager after the user agent.
	config = util.RestConfigWithUserAgent(config, "cainjector")

	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme)) // Secrets, webhook configurations
	utilruntime.Must(cmapi.AddToScheme(scheme))   // Certificates

	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// The injector watches only the metadata of Secrets; their data is read from the
		// apiserver when needed rather than by caching every Secret of the cluster.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return err
	}
	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.ValidatingWebhookConfigurationName: true,
			cainjector.MutatingWebhookConfigurationName:   true,
		},
	})
	if err != nil {
		return fmt.Errorf("registering the injectors: %w", err)
	}
	return mgr.Start(ctx)
}
