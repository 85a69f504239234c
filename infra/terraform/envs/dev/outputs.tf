# The stack's outputs, read by infra/k8s (terraform output -json).

output "region" {
  description = "AWS region (LORAPLEX_S3_REGION)."
  value       = module.loraplex.region
}

output "namespace" {
  description = "Kubernetes namespace of the workloads."
  value       = module.loraplex.namespace
}

output "cluster_name" {
  description = "EKS cluster name."
  value       = module.loraplex.cluster_name
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint (the envs' kubernetes and helm providers)."
  value       = module.loraplex.cluster_endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the Kubernetes API."
  value       = module.loraplex.cluster_certificate_authority_data
}

output "kubernetes_version" {
  description = "Kubernetes version of the cluster (manifests are validated against it)."
  value       = module.loraplex.kubernetes_version
}

output "gpu_pools" {
  description = "GPU pools: node label value and GPUs per node (engine pods select a pool)."
  value       = module.loraplex.gpu_pools
}

output "vpc_cidr" {
  description = "IPv4 block of the VPC (the ALB reaches the API pods from it)."
  value       = module.loraplex.vpc_cidr
}

output "database_subnet_cidrs" {
  description = "Database subnets (NetworkPolicy egress to PostgreSQL)."
  value       = module.loraplex.database_subnet_cidrs
}

output "cache_subnet_cidrs" {
  description = "Cache subnets (NetworkPolicy egress to Redis)."
  value       = module.loraplex.cache_subnet_cidrs
}

output "bucket_name" {
  description = "The platform's bucket (LORAPLEX_S3_BUCKET)."
  value       = module.loraplex.bucket_name
}

output "database_address" {
  description = "PostgreSQL hostname (part of LORAPLEX_DATABASE_URL)."
  value       = module.loraplex.database_address
}

output "database_port" {
  description = "PostgreSQL port."
  value       = module.loraplex.database_port
}

output "database_name" {
  description = "PostgreSQL database name."
  value       = module.loraplex.database_name
}

output "database_instance_identifier" {
  description = "RDS instance identifier (the point-in-time restore runbook names it)."
  value       = module.loraplex.database_instance_identifier
}

output "database_secret_arn" {
  description = "Secrets Manager secret of the master credentials (JSON username/password)."
  value       = module.loraplex.database_secret_arn
}

output "redis_address" {
  description = "Redis primary endpoint hostname (LORAPLEX_BROKER_URL, LORAPLEX_REDIS_URL)."
  value       = module.loraplex.redis_address
}

output "redis_port" {
  description = "Redis port (TLS)."
  value       = module.loraplex.redis_port
}

output "redis_auth_secret_arn" {
  description = "Secrets Manager secret of the Redis AUTH token (JSON: password)."
  value       = module.loraplex.redis_auth_secret_arn
}

output "admin_key_secret_arn" {
  description = "Secrets Manager secret of the admin key (LORAPLEX_ADMIN_KEY)."
  value       = module.loraplex.admin_key_secret_arn
}

output "replica_secret_arn" {
  description = "Secrets Manager secret of the gateway-to-replica shared secret."
  value       = module.loraplex.replica_secret_arn
}

output "service_account_role_arns" {
  description = "IRSA role ARN of each platform service account."
  value       = module.loraplex.service_account_role_arns
}

output "api_replicas" {
  description = "HPA bounds of the API (the database is sized for max)."
  value       = module.loraplex.api_replicas
}

output "worker_replicas" {
  description = "Celery worker pods."
  value       = module.loraplex.worker_replicas
}

output "monitoring_namespace" {
  description = "Namespace of Prometheus (allowed to scrape the replicas)."
  value       = module.loraplex.monitoring_namespace
}

output "prometheus_url" {
  description = "In-cluster Prometheus URL (KEDA's queue-depth trigger)."
  value       = module.loraplex.prometheus_url
}

output "container_log_group" {
  description = "CloudWatch log group of the containers' logs."
  value       = module.loraplex.container_log_group
}

output "image_repositories" {
  description = "ECR repository URL of each image (platform, engine)."
  value       = module.loraplex.image_repositories
}

output "s3_endpoint_url" {
  description = "Regional S3 endpoint (LORAPLEX_S3_ENDPOINT_URL)."
  value       = module.loraplex.s3_endpoint_url
}

output "api_certificate_arn" {
  description = "ACM certificate of the API's hostname (the Ingress's HTTPS listener)."
  value       = module.loraplex.api_certificate_arn
}

output "api_allowed_cidrs" {
  description = "Client CIDRs the API's load balancer accepts."
  value       = module.loraplex.api_allowed_cidrs
}

output "weights_cache_file_system_id" {
  description = "EFS file system the engine pods keep weights and Triton kernels on (its PersistentVolume)."
  value       = module.loraplex.weights_cache_file_system_id
}

output "weights_cache_volume_handle" {
  description = "EFS CSI volume handle of the engine pods' directory on the weights cache (file system::access point)."
  value       = module.loraplex.weights_cache_volume_handle
}

output "gpu_provisioner" {
  description = "What makes the GPU nodes: node_groups or karpenter (then the manifests hold a NodePool per pool)."
  value       = module.loraplex.gpu_provisioner
}

output "karpenter_node_role_name" {
  description = "IAM role of the GPU nodes Karpenter launches (its EC2NodeClass); empty without Karpenter."
  value       = module.loraplex.karpenter_node_role_name
}
