# Everything the workloads read (infra/k8s renders its manifests from `terraform output -json`).

output "region" {
  description = "AWS region (LORAPLEX_S3_REGION)."
  value       = var.region
}

output "namespace" {
  description = "Kubernetes namespace of the workloads."
  value       = var.namespace
}

output "cluster_name" {
  description = "EKS cluster name."
  value       = module.cluster.cluster_name
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint (the envs' kubernetes and helm providers)."
  value       = module.cluster.cluster_endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the Kubernetes API."
  value       = module.cluster.cluster_certificate_authority_data
}

output "kubernetes_version" {
  description = "Kubernetes version of the cluster (manifests are validated against it)."
  value       = var.kubernetes_version
}

output "gpu_pools" {
  description = "GPU pools: node label value and GPUs per node (engine pods select a pool)."
  value       = module.cluster.gpu_pools
}

output "vpc_cidr" {
  description = "IPv4 block of the VPC (the ALB reaches the API pods from it)."
  value       = module.network.vpc_cidr_block
}

output "database_subnet_cidrs" {
  description = "Database subnets (NetworkPolicy egress to PostgreSQL)."
  value       = module.network.database_subnet_cidrs
}

output "cache_subnet_cidrs" {
  description = "Cache subnets (NetworkPolicy egress to Redis)."
  value       = module.network.elasticache_subnet_cidrs
}

output "bucket_name" {
  description = "The platform's bucket (LORAPLEX_S3_BUCKET)."
  value       = module.object_storage.bucket_name
}

output "s3_endpoint_url" {
  description = "Regional S3 endpoint (LORAPLEX_S3_ENDPOINT_URL)."
  value       = "https://s3.${var.region}.amazonaws.com"
}

output "database_address" {
  description = "PostgreSQL hostname (part of LORAPLEX_DATABASE_URL)."
  value       = module.database.address
}

output "database_port" {
  description = "PostgreSQL port."
  value       = module.database.port
}

output "database_name" {
  description = "PostgreSQL database name."
  value       = module.database.name
}

output "database_instance_identifier" {
  description = "RDS instance identifier (the point-in-time restore runbook names it)."
  value       = module.database.instance_identifier
}

output "database_secret_arn" {
  description = "Secrets Manager secret of the master credentials (JSON username/password)."
  value       = module.database.master_secret_arn
}

output "redis_address" {
  description = "Redis primary endpoint hostname (LORAPLEX_BROKER_URL, LORAPLEX_REDIS_URL)."
  value       = module.cache.address
}

output "redis_port" {
  description = "Redis port (TLS)."
  value       = module.cache.port
}

output "redis_auth_secret_arn" {
  description = "Secrets Manager secret of the Redis AUTH token (JSON: password)."
  value       = module.cache.auth_secret_arn
}

output "admin_key_secret_arn" {
  description = "Secrets Manager secret of the admin key (LORAPLEX_ADMIN_KEY)."
  value       = module.identity.admin_key_secret_arn
}

output "replica_secret_arn" {
  description = "Secrets Manager secret of the gateway-to-replica shared secret."
  value       = module.identity.replica_secret_arn
}

output "service_account_role_arns" {
  description = "IRSA role ARN of each platform service account."
  value       = module.identity.service_account_role_arns
}

output "api_replicas" {
  description = "HPA bounds of the API (the database is sized for max)."
  value       = var.api_replicas
}

output "worker_replicas" {
  description = "Celery worker pods."
  value       = var.worker_replicas
}

output "monitoring_namespace" {
  description = "Namespace of Prometheus (allowed to scrape the replicas)."
  value       = module.observability.monitoring_namespace
}

output "prometheus_url" {
  description = "In-cluster Prometheus URL (KEDA's queue-depth trigger)."
  value       = module.observability.prometheus_url
}

output "container_log_group" {
  description = "CloudWatch log group of the containers' logs."
  value       = module.observability.container_log_group
}

output "image_repositories" {
  description = "ECR repository URL of each image (platform, engine)."
  value       = { for k, r in aws_ecr_repository.images : k => r.repository_url }
}

output "api_certificate_arn" {
  description = "ACM certificate of the API's hostname (the Ingress's HTTPS listener)."
  value       = var.api_certificate_arn
}

output "api_allowed_cidrs" {
  description = "Client CIDRs the API's load balancer accepts."
  value       = var.api_allowed_cidrs
}

output "weights_cache_file_system_id" {
  description = "EFS file system the engine pods keep weights and Triton kernels on (its PersistentVolume)."
  value       = module.weights_cache.file_system_id
}

output "weights_cache_volume_handle" {
  description = "EFS CSI volume handle of the engine pods' directory on the weights cache (file system::access point)."
  value       = module.weights_cache.volume_handle
}

output "gpu_provisioner" {
  description = "What makes the GPU nodes: node_groups or karpenter (then the manifests hold a NodePool per pool)."
  value       = var.gpu_provisioner
}

output "karpenter_node_role_name" {
  description = "IAM role of the GPU nodes Karpenter launches (its EC2NodeClass); empty without Karpenter."
  value       = var.gpu_provisioner == "karpenter" ? module.karpenter[0].node_role_name : ""
}
